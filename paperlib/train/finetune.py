"""Finetuning one component (paper §5.2, appendix C.3, Tables 3-5): the protocol, top to bottom.

    from paperlib.train import finetune
    from paperlib.train.config import Config
    metrics = finetune.run(Config(component="mha", lr=0.03))

The protocol: the pretrained model with a new classification head; trainable = the chosen component in every block + the
head + the final LayerNorm (``step.adapt``; or, beyond the paper, a LoRA update of the component, ``vit.lora``, or a
subset of its entries as large as a LayerNorm, ``vit.equal_capacity``); SGD with momentum 0.9 and no weight decay (built
by ``step.build_step``; or, beyond the paper, AdamW); linear warm-up then cosine decay to 0 (``lr_factor``); batches
shuffled each epoch, the last incomplete one dropped; gradients clipped at global norm 1 (the logged norm is the one
clipping saw); evaluation on the ``val`` split (20% of the training set drawn from the seed, or Flowers102's official
validation split; ``datasets.read_split``) every ``eval_every`` steps (``evaluate``; at the end only if ``eval_every``
exceeds the steps); the result is the test accuracy of the best-validation checkpoint, whatever came after it.
Accuracies are read as the authors' evaluation computes them (the mean of per-batch accuracies, ``evaluation``;
the checkpoint is chosen by it) with the exact one beside them. A loss that is not finite stops the run and is scored
as the authors' loop, which never stops, would score its NaN model (``evaluation.nan_validation``); a loss that is
not finite or above ``EXPLODED`` times chance level's marks the run ``diverged``, with the first such step, and it
keeps its test accuracy (``stop_exploded``: a loss above ``EXPLODED`` times chance level's stops it too).

What a run is and where it lives (``Config``, its folder, its files, whether it is finished) is ``runs``; how a step is
made fast (optimizer kernels, compilation, precision, fused ops, micro-batches) is ``speed``. The loop asks
``step.build_step`` for the run's step (its model adapted, its optimizer; the paper's step, ``paper_step.PaperStep``,
unless the run asks for more, then ``speed.step.make_step``'s: the step that the sweep's cost estimate and the step
benchmarks time too) and calls it once per batch. Batches are a function of (seed, step), so a run interrupted and
started again resumes from its last checkpoint (``checkpoints.resume``) and ends where an uninterrupted one would.
The runs of a spec share a pool of processes (``pool.run_spec``); a finished run's kept model is
``checkpoints.load_model``'s.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time

import torch
from torch import nn
from tqdm.auto import tqdm

from paperlib.data import datasets
from paperlib.data.loader import DeviceLoader, Transform, cache_side, decode_workers, uint8_images
from paperlib.records import cli, commands, paths, readings, runs, storage
from paperlib.speed import devices, threads
from paperlib.train import checkpoints, evaluation
from paperlib.train.config import Config, config_from
from paperlib.train.step import build_step, network
from paperlib.vit import components, methods

READ_BACK = 50  # steps between reads of losses and gradient norms from the device (and divergence checks)


def lr_factor(step: int, warmup: int, steps: int) -> float:
    """Learning-rate multiplier at ``step`` (0-based): linear warm-up, then cosine decay to 0.

    The warm-up starts from 0 (``step / warmup``: the first step's rate is 0, as in the authors' code)."""
    if step < warmup:
        return step / warmup
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))


EXPLODED = 10.0
"""A training loss above ``EXPLODED`` times chance level's (log of the number of classes, what a new head
starts near) marks a run ``diverged`` (``diverged_step``), as one whose loss is not finite; it stops the run
only with ``Config.stop_exploded``. Runs of the paper's grid stay far below (a loss above 23 on Cifar10, 46
on Cifar100)."""


def exploded_loss(num_classes: int) -> float:
    """``EXPLODED`` times chance level's loss (the log of ``num_classes``): a loss above it has exploded."""
    return EXPLODED * math.log(max(num_classes, 2))


def diverged_step(rows: list, num_classes: int) -> int | None:
    """The first step of a run's history whose loss is not finite or above ``exploded_loss``; None if none."""
    limit = exploded_loss(num_classes)
    exploded = (row["step"] for row in rows if not math.isfinite(row["train_loss"]) or row["train_loss"] > limit)
    return next(exploded, None)


def _read_back(pending: list, rows: list, limit: float = math.inf) -> bool:
    """Move the pending (row, loss, norm) steps into ``rows`` with their values; True if the run stops there.

    The run stops at a loss not finite, or above ``limit``. Rows after the first such loss are dropped: the run stops
    at that step.
    """
    if not pending:
        return False
    values = torch.stack([torch.stack([loss.double(), norm.double()]) for _, loss, norm in pending]).tolist()
    pending_rows = [row for row, _, _ in pending]
    pending.clear()
    for row, (loss, norm) in zip(pending_rows, values):
        rows.append({**row, "train_loss": loss, "grad_norm": norm})
        if not math.isfinite(loss) or loss > limit:
            return True
    return False


def run(config: Config, progress: bool = False, wait: bool = True) -> dict:
    """Finetune, evaluate and record one run; returns its metrics (see module docstring).

    A run already finished as asked (``runs.finished``) is not repeated: its metrics are
    returned (trained again only if ``save_weights`` asks for weights it did not keep). One run
    folder has one writer: a run that another process is training is waited for, then its metrics
    are returned (``wait=False``: ``storage.Busy`` is raised instead).
    """
    metrics = runs.finished(config)
    if metrics is None:
        with _claimed(config, wait) as (params, splits):
            metrics = runs.finished(config)  # the process waited for may have finished it
            if metrics is None:
                metrics = _train(config, params, splits, progress)[1]
    return metrics


def train(config: Config, progress: bool = False, wait: bool = True) -> tuple[nn.Module, dict]:
    """Train (or resume) a run and record it; returns the model at its best-validation checkpoint and the metrics.

    A LoRA run's model carries its LoRA layers; ``lora.merge`` folds them into a plain timm ViT. It holds its folder's
    lock while it trains (``_claimed``): another process training the same run is waited for (``wait=False``:
    ``storage.Busy``), never trained beside.

    Deterministic on a CPU (same seed and threads, same numbers; ``threads``); on CUDA, as the caller set PyTorch
    (``devices.deterministic``).
    """
    with _claimed(config, wait) as (params, splits):
        return _train(config, params, splits, progress)


@contextlib.contextmanager
def _claimed(config: Config, wait: bool):
    """The run's record (``runs.run_record``) and splits (``datasets.read_splits``), its folder held by the block.

    Checked before any file is touched, else a ValueError: its device here, before any data is read
    (``devices.deterministic``, which makes PyTorch's algorithms deterministic on a CPU), its folder inside the results
    root (``runs.check_inside``) and a batch no larger than its training set. Then its folder's lock
    (``storage.locked``)."""
    with devices.deterministic(config.device):
        splits = datasets.read_splits(config.dataset, config.data_root or None, config.seed, config.validation)
        params = runs.run_record(config)
        folder = runs.check_inside(config.folder())
        if config.batch_size > len(splits["train"]):
            raise ValueError(
                f"batch_size must be at most the training set of {config.dataset} ({len(splits['train'])} images), "
                f"got {config.batch_size}"
            )
        with storage.locked(folder, wait=wait):
            yield params, splits


def _loaders(config: Config, splits: dict, size: int, device: torch.device) -> tuple[dict[str, DeviceLoader], int]:
    """The run's ``splits`` as loaders on the device for a model of ``size`` pixels, and the decoded cache's side.

    The loaders: train augmented, shuffled by the seed; val and test through the evaluation transform. File datasets
    are decoded once, in parallel, then cached under the data root; a model above 224 px gets a larger cache, so its
    crops are not upsampled from 256. Torch's random generator is left as it was: decoding a file dataset the first
    time draws from it, and a run would then not draw what the same run on cached images draws."""
    side = cache_side(size)
    with torch.random.fork_rng(devices=[]):
        loaders = {
            split: DeviceLoader(
                uint8_images(images, cache_size=side, workers=decode_workers()),
                config.batch_size if split == "train" else evaluation.EVAL_BATCH,
                Transform(augment=split == "train", image_size=size, mean_std=config.mean_std),
                device=device,
                seed=config.seed if split == "train" else 0,
                drop_last=split == "train",  # as the authors' training loader: an epoch is its whole batches
                images_on="auto",
            )
            for split, images in splits.items()
        }
    return loaders, side


def _train(config: Config, params: dict, splits: dict, progress: bool) -> tuple[nn.Module, dict]:
    """``train``'s and ``run``'s work: the run of record ``params`` on its ``splits``, in its folder (``_claimed``)."""
    device = torch.device(config.device)
    threads_used = threads.apply()  # this process's share of the cores, if it shares them with others of ours

    # the model: pretrained, a new head, what trains (the component, or LoRA updates added after
    # the head so that a LoRA run's head starts as the component-wise run's), the optimizer and a step
    # as fast as the run's options make it (``step.build_step``), its schedule, then the data
    torch.manual_seed(config.seed)
    num_classes = len(splits["test"].classes)
    model = network(config, num_classes).to(device)
    size = model.patch_embed.img_size[0]
    # what trains in the component's place: all but the head and the final norm (``evaluation.component_grad_share``)
    outside = components.head_modules(model) + components.final_norm_modules(model)
    outside = {id(p) for module in outside for p in module.parameters()}
    step_fn = build_step(config, model, progress)
    inside = torch.tensor([id(p) not in outside for p in step_fn.trainable])
    optimizer = step_fn.optimizer
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config.warmup, config.steps))
    loaders, side = _loaders(config, splits, size, device)
    # recorded only now that data, model and step are made, so that a run that cannot start loses nothing; it trains
    # beside a finished result it replaces, which stays whole until the new one is (``runs.start``, ``runs.replace``)
    folder = config.folder()
    work = runs.start(folder, params)
    start_step, rows, best, seen = checkpoints.resume(work, device, (params, side), model, step_fn, schedule)
    val_batch = readings.validation_batch(params)  # the batch of the authors' validation of this run

    # the loop
    start, images_seen = time.perf_counter(), 0
    limit = exploded_loss(num_classes) if config.stop_exploded else math.inf  # a loss above it: stop
    pending = []  # steps whose loss and gradient norm are still on the device
    name = f"{config.component} steps"
    steps = tqdm(range(start_step, config.steps), name, config.steps, initial=start_step, disable=not progress)
    for step in steps:
        step_fn.network.train()
        images, labels = loaders["train"].batch(step)
        lr = optimizer.param_groups[0]["lr"]
        loss, norm = step_fn(images, labels)
        schedule.step()
        images_seen += len(images)
        pending.append(({"step": step + 1, "lr": lr}, loss, norm))
        validates = evaluation.evaluates(step + 1, config)
        if (validates or (step + 1) % READ_BACK == 0) and _read_back(pending, rows, limit):
            break
        if validates:
            row = rows[-1]
            # what the model saw, image by image: the validation that chooses the checkpoint, and the test of every
            # checkpoint, so that any reading of the run is a reading of its records (``readings``)
            val, test = (
                evaluation.evaluate(step_fn.network, loaders[split], step_fn.context, step_fn.forward)
                for split in evaluation.SEEN
            )
            seen.append(evaluation.seen_row(step + 1, val, test))
            row["component_grad_share"] = evaluation.component_grad_share(step_fn, inside)
            row["val_loss"], row["val_accuracy"] = val.loss, float(readings.accuracy(val.hits, val_batch)[0])
            current = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
            if row["val_accuracy"] > best["val_accuracy"]:  # the authors' choice: their reading, strictly greater
                best = {"val_accuracy": row["val_accuracy"], "step": step + 1, "state": current}
            state = {"params": params, "step": step + 1, "history": rows, "best": best, "cache_side": side}
            checkpoints.save_checkpoint(work, device, state | {"model": current, "seen": seen}, step_fn, schedule)
            if progress:
                steps.write(f"step {step + 1:6d}  loss {row['train_loss']:.4f}  val accuracy {row['val_accuracy']:.4f}")
    steps.close()
    _read_back(pending, rows)  # the last steps, if the run did not end on a read-back
    wall = time.perf_counter() - start

    # the result: the test accuracy of the best-validation checkpoint, read from what the run saw
    seen += evaluation.nan_validation(config, rows, loaders, num_classes)
    outcomes = evaluation.outcomes(seen, loaders)
    reading = readings.choose(outcomes, val_batch)
    if reading.best_step is not None and not reading.nan_model:
        assert reading.best_step == best["step"], (reading, best["step"])  # one rule, live and read
        model.load_state_dict(best["state"], strict=False)
        step_fn.loaded()
    # one test image is worth 100 / test_images accuracy points
    metrics = _ended(config, rows, reading, num_classes) | {"test_images": len(loaders["test"].images)}
    metrics |= _how_it_ran(config, step_fn, wall, images_seen, threads_used, side)
    metrics |= methods.trainer_of(config.method).summary(model)  # of what trained (an equal-capacity run's subset)
    kept = best["state"] if config.save_weights and not reading.nan_model else None
    checkpoints.record(work, rows, outcomes, (kept, reading.best_step), metrics)
    runs.replace(folder, work)
    return model, metrics


def _mean(values: list) -> float:
    """The mean of the finite ``values``; NaN if none."""
    finite = [value for value in values if math.isfinite(value)]
    return sum(finite) / len(finite) if finite else math.nan


def _ended(config: Config, rows: list, reading: readings.Reading, num_classes: int) -> dict:
    """How a run ended, for its ``metrics.json``: its status, the test of its best-validation checkpoint, its clipping.

    ``diverged`` from its history's ``diverged_step``, else ``finished``; the checkpoint and its test as its records
    read (``reading``: ``readings.choose``, the authors' reading, the exact one beside it); how clipping bound."""
    diverged_at = diverged_step(rows, num_classes)
    return {
        "status": "finished" if diverged_at is None else "diverged",
        "diverged_step": diverged_at,
        **{name: getattr(reading, name) for name in READ},  # from the records (``readings.choose``)
        # how clipping bound: the share of steps whose gradient norm it cut, and the component's share of that norm
        "clipped_steps": sum(row["grad_norm"] > config.clip for row in rows) / len(rows) if rows else math.nan,
        "component_grad_share": _mean([row.get("component_grad_share", math.nan) for row in rows]),
        "num_classes": num_classes,
    }


def _how_it_ran(config: Config, step_fn, wall: float, images: int, threads_used: int, side: int) -> dict:
    """How a run ran, for its ``metrics.json``: what it trained, in ``wall`` seconds over ``images``, on what."""
    device = torch.device(config.device)
    return {
        "trainable_parameters": sum(p.numel() for p in step_fn.trainable),
        "micro_batch": step_fn.micro,
        "wall_seconds": round(wall, 2),
        "images_per_second": round(images / wall, 1) if wall > 0 else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": config.step.precision,
        "optimizer": config.optimizer,
        "normalize": config.normalize,
        "cache_side": side,
        "weights": None,  # the weights file, if kept: checkpoints.record
        "mean": list(config.mean_std[0]),
        "std": list(config.mean_std[1]),
        "threads": threads_used,  # CPU threads: on a CPU their number changes the last digits
        "torch": torch.__version__,
    }


READ = ("best_val_accuracy", "best_val_accuracy_exact", "best_step", "nan_model", "test_accuracy")
READ += ("test_accuracy_exact", "test_loss")
"""What a run's ``metrics.json`` holds of its records' reading (``readings.Reading``): the checkpoint the authors'
validation accuracy chooses (``nan_model``: the authors' NaN model, ``evaluation.nan_validation``), and its test read
as theirs (``test_accuracy``) and exactly."""


RUNNING_ELSEWHERE = 75  # the exit status of ``--wait false`` when another process trains the run (EX_TEMPFAIL)


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib finetune``: one run, as notebook 05 runs it, without the notebook.

    ``python -m paperlib finetune [-f parameters/finetune/<dataset>.yaml] [--component mha --lr 1e-2 ...]`` takes the
    notebook's parameters and prints the run's metrics as JSON (any value JSON lacks as its ``str``). The step options
    may be given one by one (``--compile blocks``, ``--precision tf32``) or as a preset (``--speed none``, a file of
    ``parameters/speed/``), which sets those not given (``step_options.with_preset``). A run that another process is
    training is waited for, then reported; ``--wait false`` says it runs elsewhere and exits (status 75)."""
    try:
        values = cli.parse_parameters(argv, commands.finetune(), commands.FINETUNE, flexible=frozenset({"compile"}))
        wait = values.pop("wait", True)
        config = config_from(values)
        with contextlib.redirect_stdout(sys.stderr):  # progress on stderr: stdout is the metrics' JSON alone
            metrics = run(config, progress=True, wait=wait)
    except storage.Busy as error:
        print(error, file=sys.stderr)
        return RUNNING_ELSEWHERE
    except cli.BAD_INPUT as error:
        return cli.fail(error)
    print(json.dumps({"folder": paths.display(config.folder()), **metrics}, indent=2, default=str))
    return 0
