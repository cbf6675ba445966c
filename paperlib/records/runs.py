"""What a finetuning run is and where it lives (paper §5.2): ``Run``, its folder and its files.

Whether a run is finished as asked is here too; every run as a table is ``runs_table``. ``Run`` is checked without
the training stack; ``train.config.Config``, the run as the package makes it, adds the checks that need it.

    from paperlib.train.config import Config
    config = Config(component="mha", lr=0.03)   # validated here, once
    config.folder()   # results/finetune/demo/digits/mha/lr=0.03/seed=0

Each run owns ``results/finetune/<model>/<dataset>/<component>/lr=<lr>/seed=<seed>[suffixes]/``
(``Run.folder``; a suffix for each choice that is not the paper's, so such a run never
replaces one of the paper's) with ``params.json`` (``run_record``: what was asked, and the versions that wrote it),
``history.csv``, ``outcomes.npz`` (what it saw, image by image: ``readings``), ``metrics.json`` (written last, with
the checksums of the files before it: a run with it, whole, is finished) and, while it runs, ``checkpoint.pt``; with
``save_weights``, ``weights.safetensors``. What changes how a run trains is its fields and ``TRAINING``; how it is
read is ``RECORD`` and ``readings``: a run of an older version is kept and read as it is (``lacks``), and one trained
again replaces it only once whole (``start``, ``replace``).
One process at a time trains a run (``finetune`` holds ``storage.locked(folder)``). ``finished(config)`` (its
metrics, or None) is the one answer to "is this run finished as asked" (the sweep's markers ask it too). Reading
results (``runs_table``) needs no ``Config`` and loads no torch.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from paperlib.records import cli, methods, paths, readings, storage
from paperlib.records.cli import coerce
from paperlib.records.methods import Method
from paperlib.records.names import check_choice, check_run_component
from paperlib.records.step_options import OPTIMIZERS, STEP_OPTIONS, StepOptions, with_preset

PARAMS, METRICS, HISTORY, CHECKPOINT = "params.json", "metrics.json", "history.csv", "checkpoint.pt"
OUTCOMES = readings.OUTCOMES
NOTEBOOK = "05_finetune"  # the notebook of one run: its parameters are a Config's (``config_from``)


@dataclass(frozen=True)
class Run:
    """One finetuning run as its record holds it: its fields, its folder, checked without the training stack.

    ``train.config.Config`` is the same run checked against the training stack too (its model, data and device).

    Defaults: notebook 05's, the demo protocol (the demo ViT on digits 5-9, seconds on a CPU); the paper's per dataset:
    ``parameters/finetune/``."""

    model: str = "demo"  # short name or timm ViT name
    dataset: str = "digits"  # downstream dataset (see datasets.dataset_names())
    component: str = "mha"  # what trains: mha, fc1, fc2, ln2, ln1, full or linear
    lr: float = 0.03  # peak learning rate
    seed: int = 0  # head initialisation, validation split, batch order, augmentation
    steps: int = 100  # optimisation steps
    batch_size: int = 32  # images per step (the paper: 512)
    # images per forward pass (gradient accumulation); 0 = the whole batch, halved while the GPU runs out of memory
    micro_batch: int = 0
    warmup: int = 10  # linear warm-up steps
    eval_every: int = 10  # evaluate on val every this many steps (at the end only if it exceeds the steps)
    # official (a dataset's official validation split where it has one, Flowers102, as the authors' code) or fraction
    # (20% of the training set everywhere, the paper's words); elsewhere both are 20% drawn from the seed
    validation: str = "official"
    device: str = "cpu"  # cpu, cuda or cuda:<index>: a device this machine has
    image_size: int = 0  # 0 = the model's resolution; else the images' and the model's (position embedding resampled)
    # imagenet (the paper: ImageNet's mean and std) or model (the mean and std the model was pretrained with;
    # models.normalization)
    normalize: str = "imagenet"
    data_root: str = ""  # "" = $VIT_PLASTICITY_DATA or data/
    momentum: float = 0.9  # SGD's momentum, in [0, 1) (the paper: 0.9)
    clip: float = 1.0  # global gradient-norm clipping
    # sgd (the paper: momentum, no weight decay) or adamw (beyond the paper: AdamW, betas 0.9/0.999)
    optimizer: str = "sgd"
    # AdamW's decoupled weight decay, on weight matrices only (not biases, norms, position embedding, class token)
    weight_decay: float = 0.0
    # how its steps run, not what it trains (``paperlib.speed``; the same step to rounding): compilation, attention
    # kernel, precision, fused ops; each a parameter of its own (compile, precision...); in Python a value of
    # records.step_options, as StepOptions(precision="bf16")
    step: StepOptions = StepOptions()
    # --- beyond the paper: how the component trains, tags, kept weights ---
    # weights (the paper: the component's own weights), lora (a rank-r LoRA update beside each of its weight matrices
    # trains instead; mha, fc1, fc2 or full) or subset (as many parameters per block as a LayerNorm has, 2d: a seeded
    # random subset of the component's weights and biases, the rest frozen; mha, fc1 or fc2); its options are
    # parameters of their own (lora_rank, subset_seed...); in Python a value of records.methods, as Lora(rank=8)
    method: Method = Method()
    # a name for runs whose parameters outside the folder name (steps, batch size, warm-up, momentum, clip...) differ
    # from another's: its own folder (seed=<s>+<tag>) and results column, so an ablation keeps every run
    tag: str = ""
    # stop a run at a loss above finetune.EXPLODED times chance level's (not the authors': their loop never stops a run;
    # a loss that is not finite stops it either way, and either marks it diverged)
    stop_exploded: bool = False
    # keep the best checkpoint's trainable parameters in the run folder (weights.safetensors; checkpoints.load_model
    # rebuilds the finetuned model); not part of what a run is
    save_weights: bool = False

    def __post_init__(self):
        object.__setattr__(self, "tag", tag_text(self.tag))
        if not isinstance(self.method, Method):  # a method's name: the method with its defaults
            object.__setattr__(self, "method", methods.method_of({"method": self.method}))
        self.validate()

    def validate(self) -> "Run":
        """Fail before any work, with the valid choices: the checks that need no training stack."""
        check_run_component(self.component)
        self._check_numbers()
        check_optimizer(self.optimizer, self.weight_decay)
        if not isinstance(self.tag, str) or (self.tag and not paths.CUSTOM_NAME.fullmatch(self.tag)):
            raise ValueError(
                "tag must be '' or one folder name of letters, digits, '_', '.' or '-' (e.g. 'steps2000'), "
                f"got {self.tag!r}"
            )
        self.method.check(self.component, self.weight_decay)  # its component checked first
        if not isinstance(self.step, StepOptions):
            raise ValueError(f"step must be a StepOptions, e.g. StepOptions(precision='bf16'), got {self.step!r}")
        for name in ("save_weights", "stop_exploded"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.optimizer != "sgd" and self.momentum != Run.momentum:  # SGD's alone
            raise ValueError(
                f"momentum is SGD's; {self.optimizer} has its own (betas 0.9, 0.999): leave momentum at {Run.momentum}"
            )
        return self

    def _check_numbers(self) -> None:
        """Every number of the run in its valid range, the range in the message."""

        def number(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)

        def integer(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        if not (number(self.lr) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        for name in ("steps", "batch_size", "eval_every"):
            if not integer(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not integer(self.warmup) or not 0 <= self.warmup < self.steps:
            raise ValueError(f"warmup must be an integer in 0..steps-1 (0..{self.steps - 1}), got {self.warmup!r}")
        if not integer(self.micro_batch) or not 0 <= self.micro_batch <= self.batch_size:
            raise ValueError(
                f"micro_batch must be 0 (automatic) or 1..batch_size (1..{self.batch_size}), got {self.micro_batch!r}"
            )
        if self.micro_batch and self.batch_size % self.micro_batch:
            raise ValueError(f"micro_batch ({self.micro_batch}) must divide batch_size ({self.batch_size})")
        if not (number(self.clip) and self.clip > 0):
            raise ValueError(
                f"clip must be a positive number (the gradient-norm bound; inf: no clipping), got {self.clip!r}"
            )
        if not (number(self.momentum) and 0 <= self.momentum < 1):
            raise ValueError(f"momentum must be a number in [0, 1), got {self.momentum!r}")
        if not integer(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if not integer(self.image_size) or self.image_size < 0:
            raise ValueError(f"image_size must be 0 (the model's) or a positive integer, got {self.image_size!r}")

    @classmethod
    def defaults(cls) -> dict:
        """Each parameter's default by name (``parameters``' names): what a run is where nothing is asked.

        It is also what a record without the parameter counts as."""
        return _flat(cli.field_defaults(cls))

    @classmethod
    def comments(cls) -> dict:
        """Each parameter's meaning by name, from the comments of its field (``--help``)."""
        found = cli.field_comments(cls) | cli.field_comments(StepOptions)
        for method in methods.METHODS.values():
            found |= {f"{method.name}_{name}": text for name, text in cli.field_comments(method).items()}
        return found

    def parameters(self) -> dict:
        """The run as its parameters and its record name it (notebook 05's, a spec's, ``params.json``).

        Its fields by name, its step options each by its name, its method as its name and every method's options
        (``methods.record``)."""
        return _flat({field.name: getattr(self, field.name) for field in dataclasses.fields(self)})

    def folder(self) -> Path:
        """``results/finetune/<model>/<dataset>/<component>/lr=<lr>/seed=<seed>``, where this run lives.

        Suffixes (``paths.suffixes``, the grammar of every result folder): ``+<precision>`` unless the precision is
        the protocol's, ``+<optimizer>[-wd<weight decay>]`` unless the optimizer is, the method's
        (``methods.Method.suffix``: ``+lora-r<rank>[-a<alpha>][-d<dropout>]``, ``+equal[-s<subset seed>]``),
        ``+norm-model`` for the model's own normalisation, ``+val-fraction`` for the paper's reading of the validation
        split, and ``+tag-<tag>`` last: a bf16, AdamW, LoRA, ``normalize="model"`` or tagged run never replaces one of
        the paper's. Other parameters (steps, batch size, warm-up, momentum, clip...) are not in the name: a run that
        changes them replaces the run in its folder unless it has a tag of its own."""
        return run_folder(self.parameters(), self.method)


def _flat(fields: dict) -> dict:
    """A run's ``fields`` as its parameters: its ``step`` as its options, its ``method`` as its name and options.

    Each in its place; every method's options, the others' at their defaults (``methods.record``)."""
    flat = {}
    for name, value in fields.items():
        if name == "step":
            flat |= dataclasses.asdict(value)
        elif name == "method":
            flat |= methods.record(value)
        else:
            flat[name] = value
    return flat


def written_one_way(values: dict) -> dict:
    """A run's parameters (``Run.defaults``' names) as a ``Run`` holds them, unchecked.

    A number as a tag (a sweep spec's ``tag: [2000]``) as its text, and the method's options as its value writes them
    (a LoRA run's alpha 0 as the rank: lora_alpha=0 and lora_alpha=rank are one run, one folder, one record, one row of
    the results tables)."""
    return values | {"tag": tag_text(values["tag"])} | methods.record(methods.method_of(values))


def tag_text(tag):
    """A run's ``tag`` as a ``Run`` holds it: a number (a sweep spec's ``tag: [2000]``) as its text, else as it is."""
    return f"{tag:g}" if isinstance(tag, (int, float)) and not isinstance(tag, bool) else tag


def run_folder(record: dict, method: Method) -> Path:
    """The folder of the run ``record`` describes (a ``Config``'s parameters, ``Config.folder``), trained by ``method``.

    ``method``: the run's (``methods.method_of(record)`` for a record alone)."""
    r = record
    run = f"seed={r['seed']}" + paths.suffixes(
        ("", r["precision"], "fp32"),
        ("", r["optimizer"] + (f"-wd{r['weight_decay']:g}" if r["weight_decay"] else ""), "sgd"),
        ("", method.suffix(), ""),
        ("norm", r["normalize"], "imagenet"),
        ("val", r["validation"], "official"),
        ("tag", r["tag"], ""),
    )
    return finetune_root() / r["model"] / r["dataset"] / r["component"] / f"lr={r['lr']:g}" / run


def check_optimizer(optimizer: str, weight_decay: float) -> str:
    """``optimizer`` if valid with ``weight_decay``; otherwise a ValueError with the valid choices."""
    check_choice(optimizer, OPTIMIZERS, "optimizer", "optimizers")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a non-negative number, got {weight_decay!r}")
    if optimizer == "sgd" and weight_decay:
        raise ValueError("the paper's SGD has no weight decay: weight_decay is for optimizer='adamw'")
    return optimizer


def config_fingerprints(record: dict) -> dict:
    """What the custom dataset and model of a run's fields hold now, as its record keeps them.

    The fields are ``record``; what they hold is ``paths.dataset_fingerprint`` and ``paths.model_fingerprint``, kept
    as ``run_record`` keeps them (``{"dataset": ..., "model": ...}``); empty for the built-in ones. A sweep's marker
    of another notebook's run keeps those of every custom name among its parameters instead
    (``sweep.parameter_fingerprints``)."""
    found = {
        "dataset": paths.dataset_fingerprint(record["dataset"], record["data_root"] or None),
        "model": paths.model_fingerprint(record["model"]),
    }
    return {key: value for key, value in found.items() if value}


TRAINING = 3
"""The version of how a run trains beyond its ``Config``: the one reason to train a result again. 3, a run whose loss
explodes (finite, above ``finetune.EXPLODED`` times chance level's) goes on to its last step, as the authors' loop, and
keeps its test accuracy (``Config.stop_exploded``: stopped there); 2, the authors' splits (``names.SPLITS_VERSION``
2), warm-up (``finetune.lr_factor``: 0 at the first step), validation steps (multiples of ``eval_every`` only),
batches (the last incomplete one of an epoch dropped) and new head (PyTorch's ``nn.Linear`` initialisation). A run
trained by another is kept and read as it is, labelled (``lacks``); it trains again only when asked
(``paths.retrain_older``). See ``docs/reliability.md`` (what is training, what is reading) and ``docs/fidelity.md``."""

RECORD = 7
"""The version of what a run records and how it is read, never a reason to train again. 7, the authors' reading:
the validation split in the order of their ``random_split`` (``splits.validation_split``), read at the run's
validation batch (``readings.validation_batch``) in float32 per batch, the best chosen from 0; 6, what it saw image
by image at each validation (``readings.OUTCOMES``), from which its metrics are read; 5, the checksums of its files
and of every JSON record (``storage.write_checked``); 4, its accuracies as the authors' evaluation computes them (the
mean of per-batch accuracies; the checkpoint chosen by it), a run whose loss turns NaN scored as their loop scores
its NaN model; 3 and before, the exact accuracies alone. A record of an older version is read as it is, labelled
with what it lacks (``lacks``), and upgraded in place where its files suffice (``upgrade``: checksums added to a
record 4; a record 6 read again from what it saw)."""

VERSIONS = ("training", "record", "protocol")
"""The keys of ``params.json`` that say which version wrote it (``versions``), not what the run is."""


def versions(params: dict) -> tuple[int | None, int | None]:
    """(``TRAINING``, ``RECORD``) of the version that wrote a run's record (``params.json``); None where it says none.

    Before record 6 one number, ``protocol``, said both: protocols 3 to 5 trained alike and differ in their records."""
    if "record" in params:
        return params.get("training"), params.get("record")
    protocol = params.get("protocol")
    if not isinstance(protocol, int) or isinstance(protocol, bool):
        return None, None
    return min(protocol, 3), protocol


def lacks(params: dict) -> list[str]:
    """What the run a record (``params.json``) describes lacks against today's, a short phrase each; [] for today's.

    Another ``TRAINING`` (its numbers are another protocol's), an older ``RECORD`` (what it did not record), and the
    ``Run`` fields added since (read as their defaults, which is what the run did)."""
    training, record = versions(params)
    said = []
    if training != TRAINING:
        said.append(f"trained by protocol {training}" if training else "records no protocol")
    if record is None or record < 4:
        said.append("exact accuracies alone")
    elif record < 5:
        said.append("no checksums")
    if record is None or record < 6:
        said.append("no per-image outcomes")
    elif record < RECORD:
        said.append("read in sorted validation order at batch 512")
    added = sorted(set(Run.defaults()) - params.keys())
    if added:
        said.append(f"no {', '.join(added)} (read as {'its' if len(added) == 1 else 'their'} default)")
    return said


def run_record(config: Run | dict) -> dict:
    """What ``params.json`` (and a checkpoint) record of a run.

    Its parameters, today's ``TRAINING`` and ``RECORD`` and, for custom datasets and models, their fingerprints.
    ``config``: a ``Config``, or its fields as a dict (``spec_records``' runs, made without one)."""
    fields = config if isinstance(config, dict) else config.parameters()
    fingerprints = config_fingerprints(fields)
    written_by = {"training": TRAINING, "record": RECORD}
    return fields | written_by | ({"fingerprints": fingerprints} if fingerprints else {})


OUTPUT_ONLY = ("save_weights",)
"""``Config`` fields that say what a run keeps, not what it computes: runs that differ only in them
are the same run."""

HOW_IT_RAN = ("device", "data_root", "micro_batch", "compile", "compile_mode", "attention", "fused")
"""``Config`` fields that say how a run ran, not what it trains: ``load_model`` rebuilds a run's
model whatever they were (a run on a GPU, compiled, loads on a CPU)."""

WEIGHTS = "weights.safetensors"
"""The file in a run's folder that ``save_weights`` keeps: its trainable parameters at the best checkpoint."""

FILES = (PARAMS, METRICS, HISTORY, CHECKPOINT, WEIGHTS, OUTCOMES)
"""Every file a run keeps in its folder."""


def differing(saved: dict, record: dict, how_it_ran: bool = True) -> list[str]:
    """The one answer to "is the run recorded in a folder the one asked for": [] if it is, else what differs.

    ``saved``: the record in the folder (its ``params.json``, or a checkpoint's); ``record``: ``run_record`` of the
    run asked. What a run keeps (``OUTPUT_ONLY``) never counts, nor which version wrote it (``VERSIONS``: a run of an
    older version is the one asked for, ``lacks`` says what it lacks). How it ran (``HOW_IT_RAN``) counts for what
    writes the folder (``finished``, ``start``, a checkpoint resumed: train it again?), not with ``how_it_ran`` False
    for what reads a result (``runs_table.for_spec``, ``checkpoints.load_model``: the same run to rounding). A ``Run``
    field the saved record lacks counts as its default (a field is added with the default that does what runs did
    before it); a key ``Run`` does not have, or custom data's fingerprints that only one of them has, differs: that
    is another run."""
    ignore = OUTPUT_ONLY + VERSIONS + (() if how_it_ran else HOW_IT_RAN)
    saved = Run.defaults() | saved
    return sorted(
        key for key in saved.keys() | record.keys() if key not in ignore and saved.get(key) != record.get(key)
    )


def read_params(folder: Path) -> dict | None:
    """The ``params.json`` of the run in ``folder``, checked; None if it has none, or a damaged one (a warning).

    A record of ``RECORD`` 5 or later must carry its checksum; an older one never did."""
    return storage.json_or_none(folder / PARAMS, checksum=lambda params: (versions(params)[1] or 0) >= 5)


NUMBERS = ("best_val_accuracy", "best_val_accuracy_exact", "test_accuracy", "test_accuracy_exact", "test_loss")
NUMBERS += ("clipped_steps", "component_grad_share", "wall_seconds", "images_per_second")
COUNTS = ("best_step", "test_images", "trainable_parameters")
"""The values of a ``metrics.json`` that are numbers (None or NaN where a run has none), and whole numbers."""


def read_metrics(folder: Path, params: dict, whole: bool = False) -> dict | None:
    """The ``metrics.json`` of the run in ``folder`` whose ``params.json`` holds ``params``, checked; None if none.

    A record of ``RECORD`` 5 or later must carry its checksum (``storage.read_json``'s ``checksum``); every value
    ``NUMBERS`` and ``COUNTS`` name must be a number of its kind, and ``status`` one a run ends with. A damaged one
    (the files it records too, with ``whole``) is named in a one-line warning and read as None: left out of the
    tables, never taken as finished."""
    record = versions(params)[1] or 0
    # a record before 5 kept the sizes of its files alone: those are what is checked
    metrics = storage.json_or_none(folder / METRICS, whole and record >= 5, checksum=record >= 5)
    if metrics is None:
        return None
    bad = [name for name in NUMBERS if not _number(metrics.get(name))]
    bad += [name for name in COUNTS if not (metrics.get(name) is None or _number(metrics[name], whole=True))]
    if metrics.get("status") not in ("finished", "diverged"):
        bad.append("status")
    if bad:
        values = ", ".join(f"{name} {metrics.get(name)!r}" for name in bad)
        warnings.warn(f"{paths.display(folder / METRICS)} holds values of the wrong kind ({values}; damaged?)")
        return None
    if record < 4:  # its accuracies were the exact ones (``lacks``): read as such, the authors' reading absent
        metrics = metrics | {f"{name}_exact": metrics.get(name) for name in ("test_accuracy", "best_val_accuracy")}
        metrics |= {"test_accuracy": math.nan, "best_val_accuracy": math.nan}
    return metrics


def upgradable(params: dict | None) -> bool:
    """Whether the run a record (``params.json``) describes is upgraded in place (``upgrade``): a record 4 or 6."""
    return params is not None and versions(params) in ((TRAINING, 4), (TRAINING, 6))


def upgrade(folder: Path, older_order=None) -> bool:
    """Upgrade the run in ``folder`` in place where its records suffice (``upgradable``); whether it did.

    A record 4 holds the sizes of its files, not their checksums: each file still of its recorded size gets its
    checksum, its ``metrics.json`` and ``params.json`` theirs, and the record says 5. Its results are unchanged; one
    whose files are not the size recorded is left as it is (named damaged when read). A record 6 is read again from
    its outcomes (``_read_again``); ``older_order``: a function that gives its validation split's order
    (``datasets.older_validation_order``)."""
    params = read_params(folder)
    if not upgradable(params):
        return False
    if versions(params)[1] == 6:
        return older_order is not None and _read_again(folder, params, older_order())
    metrics = storage.json_or_none(folder / METRICS, checksum=False)
    files = (metrics or {}).get("files", {})
    whole = all(isinstance(size, int) and storage.size_of(folder / name) == size for name, size in files.items())
    if not files or not whole:
        return False
    metrics["files"] = {name: storage.kept_of(folder / name) for name in files}
    storage.write_json(folder / METRICS, metrics)
    params = {key: value for key, value in params.items() if key != "protocol"}
    storage.write_json(folder / PARAMS, params | {"training": TRAINING, "record": 5})
    return True


def _read_again(folder: Path, params: dict, order) -> bool:
    """Make the record 6 in ``folder`` the record 7 its run would write today, from what it saw; whether it did.

    Its validation outcomes go into the authors' order (``order``: positions into its sorted ones; None, unchanged),
    and its history's validation accuracies and its metrics' readings are read again as ``RECORD`` 7 reads them
    (``readings.choose`` at the run's ``readings.validation_batch``). Done beside it and put in its place whole
    (``replace``). A damaged run, or one whose weights were kept of a checkpoint the new reading does not choose, is
    left as it is."""
    metrics = read_metrics(folder, params, whole=True)
    if metrics is None:
        return False
    seen = readings.read(folder)
    if order is not None:
        seen = dataclasses.replace(seen, val=seen.val[:, order])
    batch = readings.validation_batch(params)
    reading = readings.choose(seen, batch)
    if metrics.get("weights") and reading.best_step != metrics["best_step"]:
        return False
    work = staging(folder)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(folder, work)
    table = pd.read_csv(io.BytesIO(storage.read_checked(folder / METRICS, HISTORY)))
    validated = dict(zip(seen.steps[~seen.nan_model].tolist(), readings.accuracy(seen.val[~seen.nan_model], batch)))
    table["val_accuracy"] = [validated.get(step, value) for step, value in zip(table["step"], table["val_accuracy"])]
    metrics["files"][HISTORY] = storage.write_checked(work / HISTORY, lambda tmp: table.to_csv(tmp, index=False))
    metrics["files"][OUTCOMES] = readings.write(work / OUTCOMES, seen)
    storage.write_json(work / METRICS, metrics | dataclasses.asdict(reading))
    storage.write_json(work / PARAMS, params | {"record": RECORD})
    replace(folder, work)
    return True


def _number(value, whole: bool = False) -> bool:
    """Whether ``value`` is a number (None too: a run without one); ``whole``: a whole one."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not whole or float(value).is_integer()


def finished(config: Run) -> dict | None:
    """The metrics of ``config``'s run if it is finished as asked; None otherwise.

    Finished as asked: its recorded parameters (``params.json``) are ``config``'s on the same custom data and model as
    now (``differing``, read here from the folder computed once), its ``metrics.json`` is there
    and whole, with the files it records each the one written (``read_metrics``; a damaged run is named in a warning
    and trained again, beside it: ``start``), and, with ``save_weights``, its weights are kept (or it has none to
    keep: it diverged before any checkpoint, or its best is the authors' NaN model, ``nan_model``). A run of an older
    version is finished as it is (``lacks``), unless ``paths.retrain_older()``: never trained again unasked."""
    folder = config.folder()
    recover(folder)
    params = read_params(folder)
    if params is None:
        return None
    if differing(params, run_record(config)) or (lacks(params) and paths.retrain_older()):
        return None
    metrics = read_metrics(folder, params, whole=True)
    if metrics is None:
        return None
    has_weights = metrics.get("best_step") is not None and not metrics.get("nan_model")
    lacking = config.save_weights and not (folder / WEIGHTS).is_file() and has_weights
    return None if lacking else metrics


def is_finished(config: Run) -> bool:
    """Whether ``config``'s run is finished as asked (``finished``)."""
    return finished(config) is not None


def start(folder: Path, params: dict) -> Path:
    """Record that the run in ``folder`` starts (``params.json``); returns the folder it trains in.

    ``params`` is its ``run_record``. It trains in ``folder``, unless ``folder`` holds a result (a ``metrics.json``:
    a run of an older version, of other parameters, or damaged); then beside it, in ``staging(folder)``, and the
    result stays whole and readable until ``replace`` puts the new one in its place. The run is partial (no
    ``metrics.json``) until it ends. What a partial run of other parameters left where it trains (its checkpoint)
    goes first, so that it is never resumed as this run's."""
    check_inside(folder)
    work = staging(folder) if (folder / METRICS).exists() else folder
    saved = read_params(work)
    same = saved is not None and not differing(saved, params) and versions(saved) == versions(params)
    for stale in () if same else (HISTORY, CHECKPOINT, WEIGHTS, OUTCOMES):
        (work / stale).unlink(missing_ok=True)
    storage.write_json(work / PARAMS, params)
    return work


def staging(folder: Path) -> Path:
    """Where a run trains that will replace the result in ``folder``: ``.<folder name>.training`` beside it."""
    return folder.parent / f".{folder.name}.training"


def replace(folder: Path, work: Path) -> None:
    """Put the run that ended in ``work`` (``start``'s) in ``folder``'s place; nothing to do if it trained there.

    Two renames on one disk: the result it replaces is moved aside, then deleted once the new one is in place. A
    replacement cut between them is finished by the next ``finished`` of the run (``recover``)."""
    if work == folder:
        return
    aside = _aside(folder)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(folder, aside)
    os.replace(work, folder)
    shutil.rmtree(aside)


def _aside(folder: Path) -> Path:
    """Where ``replace`` moves the result it replaces: ``.<folder name>.replaced`` beside it."""
    return folder.parent / f".{folder.name}.replaced"


def recover(folder: Path) -> None:
    """Finish a ``replace`` of ``folder`` that was cut between its renames (a process killed there).

    Its new result is whole (its ``metrics.json`` was written before): it goes in place and the old one, aside, goes.
    Nothing to do otherwise."""
    aside = _aside(folder)
    if not aside.exists():
        return
    if not folder.exists() and (staging(folder) / METRICS).exists():
        os.replace(staging(folder), folder)
    if folder.exists():
        shutil.rmtree(aside)


def check_inside(folder: Path) -> Path:
    """``folder`` if it, and each file a run keeps there (``FILES``), lies inside the results root once resolved.

    A symbolic link out of the results root (of a received archive, say) is refused in one line (a ValueError) before
    anything is written or deleted: writes and deletes never leave the results root."""
    root = paths.results_dir().resolve()
    for path in (folder, *(folder / name for name in FILES)):
        if (path.exists() or path.is_symlink()) and not path.resolve().is_relative_to(root):
            raise ValueError(
                f"{paths.display(path)} leads out of the results root {paths.display(paths.results_dir())} "
                "(a symbolic link): refused, nothing written or deleted"
            )
    return folder


def history(config: Run) -> pd.DataFrame:
    """The history table of a run that ended; a ValueError naming its ``history.csv`` if damaged (``read_checked``)."""
    return pd.read_csv(io.BytesIO(storage.read_checked(config.folder() / METRICS, HISTORY)))


HISTORY_COLUMNS = ["step", "lr", "train_loss", "grad_norm", "val_loss", "val_accuracy", "component_grad_share"]
"""The columns of a run's ``history.csv``: a row per step (validation's where it validated)."""


def finetune_root(root: str | Path | None = None) -> Path:
    """``results/finetune`` (or ``<root>/finetune``)."""
    return (Path(root) if root is not None else paths.results_dir()) / "finetune"


def config_values(parameters: dict) -> dict:
    """Notebook 05's parameters (``Run.defaults``' names), typed, with a speed preset's step options.

    ``run_fields`` makes ``Config``'s fields of them. Its speed preset (``speed``, a name) put in by
    ``step_options.with_preset`` (its step options the run does not give; refused in a precision it is not offered
    for), the rest typed by their defaults (YAML reads ``1e-2`` as a string); an unknown name is refused with the valid
    ones."""
    defaults = Run.defaults()
    values = dict(parameters)
    values = with_preset(values.pop("speed", "auto"), values)
    unknown = sorted(set(values) - set(defaults))
    if unknown:
        raise ValueError(f"unknown run parameter(s) {', '.join(unknown)}; valid: {', '.join(defaults)}")
    return {key: value if key == "compile" else coerce(key, value, defaults[key]) for key, value in values.items()}


def run_fields(parameters: dict) -> dict:
    """A run's parameters (``config_values``') as ``Run``'s fields: its step options, its method's name and options.

    Each as its value: ``StepOptions``, a ``methods.Method``."""
    options = methods.options()
    fields = {name: value for name, value in parameters.items() if name not in options and name not in STEP_OPTIONS}
    step = StepOptions(**{name: value for name, value in parameters.items() if name in STEP_OPTIONS})
    return fields | {"step": step, "method": methods.method_of(parameters)}
