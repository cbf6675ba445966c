"""``python -m paperlib finetune`` and ``python -m paperlib plasticity``: notebook parameters on a command line;
every command's report of a bad input."""

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import __main__ as bench
from paperlib import __main__ as entry
from paperlib.analysis import precision_check, summary
from paperlib.data import datasets
from paperlib.measure import plasticity
from paperlib.records import cli, commands, paths, runs, specs
from paperlib.records.step_options import PRESET_OPTIONS
from paperlib.reports import execute, notebook
from paperlib.sweeps import sweep
from paperlib.train import demo, finetune
from paperlib.train.config import Config, config_from


def test_values_take_the_type_of_the_default():
    assert cli.coerce("lr", "1e-2", 0.01) == 0.01 and isinstance(cli.coerce("lr", 1, 0.01), float)
    assert cli.coerce("steps", "1e3", 300) == 1000 and cli.coerce("steps", 40, 300) == 40
    assert cli.coerce("graph", "True", False) is True and cli.coerce("graph", "no", False) is False
    assert cli.coerce("data_root", "null", None) is None and cli.coerce("model", 5, "demo") == "5"
    assert cli.coerce("data_root", None, "") == ""  # a YAML null for a folder: the default folder
    with pytest.raises(ValueError, match="seed must be int, got True"):  # YAML's true for a number
        cli.coerce("seed", True, 0)
    for name, value, default, message in [
        ("steps", "2.5", 1, "steps must be int"),
        ("lr", "fast", 0.1, "lr must be float"),
        ("graph", "maybe", False, "true or false"),
    ]:
        with pytest.raises(ValueError, match=message):
            cli.coerce(name, value, default)


def test_finetune_command_reads_parameter_files_then_overrides(tmp_path, monkeypatch, capsys, move_results):
    move_results("results")
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("dataset: digits_c/snow\nsteps: 50\nbatch_size: 8\ncompile: false\n")
    second.write_text("steps: 4\nwarmup: 1\neval_every: 2\n")  # later files win
    assert (
        finetune.main(["-f", str(first), "-f", str(second), "--component", "ln2", "--lr", "3e-2", "--seed", "5"]) == 0
    )
    config = Config(
        dataset="digits_c/snow", component="ln2", lr=0.03, seed=5, steps=4, batch_size=8, warmup=1, eval_every=2
    )
    saved = json.loads((config.folder() / "params.json").read_text())
    assert config.folder().is_relative_to(tmp_path / "results") and saved["steps"] == 4 and saved["component"] == "ln2"
    assert json.loads((config.folder() / "metrics.json").read_text())["status"] == "finished"


def test_finetune_command_prints_the_metrics(tmp_path, monkeypatch, capsys, move_results):
    move_results(".")
    assert (
        finetune.main(
            ["--steps", "2", "--warmup", "0", "--eval-every", "1", "--batch-size", "4", "--component", "linear"]
        )
        == 0
    )
    captured = capsys.readouterr()
    printed = json.loads(captured.out)  # stdout is the JSON alone; progress went to stderr
    assert printed["status"] == "finished" and printed["folder"].endswith("linear/lr=0.03/seed=0")
    assert "step      2" in captured.err


def test_bad_commands_stop_before_any_work(tmp_path, monkeypatch, capsys, move_results):
    move_results(".")
    assert finetune.main(["--component", "attn"]) == 2
    assert "valid configurations: mha, fc1, fc2, ln2, ln1, full, linear" in capsys.readouterr().err
    assert finetune.main(["--lr", "fast"]) == 2
    assert "lr must be float" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("component: mha\nlearning_rate: 0.1\n")
    assert finetune.main(["-f", str(bad)]) == 2
    assert "unknown parameter(s) learning_rate; valid: " in capsys.readouterr().err
    with pytest.raises(SystemExit):  # an unknown option: argparse's usage
        finetune.main(["--epochs", "3"])
    assert not (tmp_path / "finetune").exists()


def test_plasticity_command(tmp_path, monkeypatch, capsys, move_results):
    move_results(".")
    assert (
        plasticity.main(
            ["--n-pairs", "6", "--batch-size", "3", "--progress", "false", "--sample", "random", "--seed", "1"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Kendall's tau" in out and all(label in out for label in ("MHA", "FC1", "FC2", "LN2", "LN1"))
    metadata = json.loads((plasticity.Measurement(sample="random", seed=1).folder() / "metadata.json").read_text())
    assert (metadata["n_pairs"], metadata["sample"], metadata["seed"], metadata["reference"]) == (
        6,
        "random",
        1,
        "digits_source",
    )
    assert plasticity.main(["--dataset", "digits_c/nowhere", "--progress", "false"]) == 2
    assert "unknown dataset 'digits_c/nowhere'" in capsys.readouterr().err


def shown(default) -> str:
    """A default as every command's --help writes it: unquoted, as argparse's own, but '' for empty text."""
    return "''" if default == "" else str(default)


def test_plasticity_help_gives_every_option_a_meaning_a_type_and_a_default(capsys):
    with pytest.raises(SystemExit) as done:
        plasticity.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    comments = cli.field_comments(plasticity.Measurement)
    options = {
        field.name: (comments[field.name], field.default) for field in dataclasses.fields(plasticity.Measurement)
    }
    # run's options beside the measurement's fields: how it runs, not what it measures
    options |= {
        "batch_size": (commands.PLASTICITY_HELP["batch_size"], 64),
        "device": (commands.PLASTICITY_HELP["device"], "cpu"),
        "data_root": (commands.PLASTICITY_HELP["data_root"], None),
        "progress": (commands.PLASTICITY_HELP["progress"], True),
        "num_workers": (commands.PLASTICITY_HELP["num_workers"], 0),
    }
    assert set(commands.PLASTICITY_HELP) == set(options) - set(comments)
    # the command line's defaults of run's options, written without torch, are run's own (num_workers: automatic)
    signature = inspect.signature(plasticity.run).parameters
    assert {name: signature[name].default for name in commands.MEASURING} == commands.MEASURING | {"num_workers": None}
    for name, (meaning, default) in options.items():
        meaning = " ".join(meaning.split())
        assert meaning, f"--{name} has no meaning for --help"
        assert f"{meaning} (" in text and f"default {shown(default)})" in text, name
    assert "--n-pairs INT" in text and "--progress BOOL" in text
    assert "embedding (the paper's definition) or in_situ" in text and "first (the authors'" in text  # the choices
    assert "--root" not in text  # one name for the data folder, notebook 02's


def test_the_command_with_no_options_is_notebook_05_with_no_parameters():
    # the notebook's parameters cell, as papermill would run it, and the command's defaults: one Config, one run
    notebook = specs.notebook_parameters(paths.NOTEBOOKS / "05_finetune.ipynb")
    assert config_from(notebook) == config_from({"speed": "auto"}) == Config()
    assert Config().folder() == config_from(notebook).folder()


NOTEBOOK_05 = paths.NOTEBOOKS / "05_finetune.ipynb"


def test_notebook_05_takes_precision_and_every_step_option_flat_the_options_not_given():
    notebook = specs.notebook_parameters(NOTEBOOK_05)
    defaults = Config.defaults()
    assert set(notebook) - {"speed"} <= set(defaults) and notebook["speed"] == "auto"  # speed: a preset's name
    assert notebook["precision"] == defaults["precision"]
    # None: not given, so that the preset can tell -p compile False (kept) from no -p compile (the preset's)
    assert {name: notebook[name] for name in PRESET_OPTIONS} == dict.fromkeys(PRESET_OPTIONS)


def test_papermills_precision_is_a_parameter_of_notebook_05_and_tf32_is_refused_on_a_cpu(monkeypatch):
    import IPython

    cell = next(
        "".join(c["source"])
        for c in json.loads(NOTEBOOK_05.read_text())["cells"]
        if "parameters" in c["metadata"].get("tags", [])
    )
    history = ["", cell, '# Parameters\nprecision = "tf32"\n', "import paperlib\n"]
    shell = type("Shell", (), {"user_ns": {"In": history}})()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    notebook.check_parameters()  # -p precision tf32: accepted
    # and reaches Config as it is, which refuses it on a CPU in one line
    assert runs.config_values({"precision": "tf32", "device": "cpu"}) == {"precision": "tf32", "device": "cpu"}
    with pytest.raises(ValueError) as error:
        config_from({"precision": "tf32", "device": "cpu"})
    message = str(error.value)
    assert "\n" not in message and "TF32 tensor cores" in message
    assert "valid precisions on cpu: fp32, autocast, bf16" in message


def test_papermill_runs_notebook_05_with_precision_tf32_to_the_precision_error(tmp_path):
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="valid precisions on cpu: fp32, autocast, bf16"):
        execute.execute(NOTEBOOK_05, tmp_path / "out.ipynb", parameters={"precision": "tf32"})


def test_a_speed_preset_sets_the_step_options_not_given():
    h100 = {"compile": "blocks", "compile_mode": "coordinate-descent", "fused": "gelu+qkv"}
    asked = {"speed": "h100", "precision": "autocast"}
    assert runs.config_values(asked) == {"precision": "autocast"} | h100
    # what the notebook passes (every step option, None where not given) is the same
    notebook = dict.fromkeys(PRESET_OPTIONS) | {"precision": "fp32"}
    assert runs.config_values(notebook | asked) == {"precision": "autocast"} | h100
    # an option given overrides the preset's, a default value included (-p speed h100 -p compile False)
    assert runs.config_values(asked | {"fused": "none", "compile": True})["fused"] == "none"
    assert runs.config_values(asked | {"compile": True})["compile"] is True
    given = runs.config_values(notebook | asked | {"compile": False, "fused": "auto"})
    assert given == {"precision": "autocast", "compile": False, "compile_mode": "coordinate-descent", "fused": "auto"}
    # None is "not given" for a step option only
    with pytest.raises(ValueError):
        config_from({"lr": None})
    assert runs.config_values({"speed": "none", "precision": "bf16"}) == {
        "precision": "bf16",
        "compile": False,
        "attention": "auto",
        "fused": "none",
    }
    # the preset's rule, whatever the options: refused in a precision it was not measured faster in
    with pytest.raises(ValueError, match="speed preset 'h100' is not offered for precision 'bf16'"):
        runs.config_values({"speed": "h100", "precision": "bf16", "fused": "none"})
    with pytest.raises(ValueError, match="unknown precision 'fp16'; valid choices: fp32, tf32, autocast, bf16"):
        runs.config_values({"speed": "h100", "precision": "fp16"})
    # one name each: no mapping of options under speed, no precision in a preset
    with pytest.raises(ValueError, match="speed must name a preset.*as parameters of their own"):
        runs.config_values({"speed": {"compile": "blocks"}})


def test_a_preset_file_sets_step_options_but_not_precision(tmp_path):
    (tmp_path / "mine.yaml").write_text("compile: blocks\nprecision: bf16\n")
    with pytest.raises(ValueError, match="unknown step option.s. precision; a preset sets compile, compile_mode"):
        runs.config_values({"speed": str(tmp_path / "mine.yaml")})
    (tmp_path / "mine.yaml").write_text("compile: blocks\n")
    assert runs.config_values({"speed": str(tmp_path / "mine.yaml")}) == {"compile": "blocks"}


def one_error_line(err: str) -> str:
    """The one line a command reports a bad input with (``error: ...``)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def bad_files(tmp_path):
    """A missing file, a file that is not YAML, YAML that is not a mapping, and a folder."""
    (tmp_path / "broken.yaml").write_text("component: [mha\n")
    (tmp_path / "list.yaml").write_text("- mha\n- fc1\n")
    (tmp_path / "folder.yaml").mkdir()
    return {
        "missing": (tmp_path / "missing.yaml", "not found"),
        "broken": (tmp_path / "broken.yaml", "is not valid YAML"),
        "list": (tmp_path / "list.yaml", "not a mapping"),
        "folder": (tmp_path / "folder.yaml", "not found"),
    }


@pytest.mark.parametrize("case", ["missing", "broken", "list", "folder"])
def test_every_command_reports_a_bad_parameter_file_or_spec_in_one_line(case, bad_files, capsys):
    path, message = bad_files[case]
    for main in (finetune.main, plasticity.main):
        assert main(["-f", str(path)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert message in line and path.name in line
    for main in (sweep.main, summary.main):
        assert main([str(path)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert message in line and path.name in line
    assert finetune.main(["--speed", str(path)]) == 2  # a speed preset file
    assert path.name in one_error_line(capsys.readouterr().err)


def test_every_command_reports_a_bad_notebook_weight_file_or_folder_in_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "garbage.ipynb").write_text("not json")
    (tmp_path / "other.ipynb").write_text('{"a": 1}')
    (tmp_path / "garbage.safetensors").write_text("not weights")
    commands = [
        (execute.main, ["inplace", str(tmp_path / "missing.ipynb")], "missing.ipynb"),
        (execute.main, ["inplace", str(tmp_path / "garbage.ipynb")], "not appear to be JSON"),
        (execute.main, ["inplace", str(tmp_path / "other.ipynb")], "could not be converted"),
        (demo.main, ["evaluate", "--weights", str(tmp_path / "missing.safetensors")], "weight file not found"),
        (demo.main, ["evaluate", "--weights", str(tmp_path / "garbage.safetensors")], "garbage.safetensors"),
        (bench.main, ["data", "--root", str(tmp_path / "no-data"), "--batches", "1"], "no-data"),
    ]
    for main, argv, message in commands:
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2 and message in one_error_line(capsys.readouterr().err), argv
    (tmp_path / "rows.json").write_text("[{")
    variants = ["variants", "--json", str(tmp_path / "rows.json"), "--compile", "none", "--precision", "fp32"]
    with pytest.raises(SystemExit) as stopped:
        bench.main([*variants, "--device", "cpu", "--steps", "1", "--repeats", "1"])
    assert stopped.value.code == 2 and "rows.json" in one_error_line(capsys.readouterr().err)
    assert finetune.main(["--data-root", str(tmp_path / "no-data"), "--dataset", "cifar10"]) == 2
    assert "no-data" in one_error_line(capsys.readouterr().err)
    monkeypatch.setenv("VIT_PLASTICITY_MODELS", str(tmp_path / "models"))
    (tmp_path / "models" / "broken").mkdir(parents=True)
    (tmp_path / "models" / "broken" / "config.json").write_text('{"architecture": ')
    assert finetune.main(["--model", "custom/broken"]) == 2
    assert "config.json is not whole JSON" in one_error_line(capsys.readouterr().err)


def test_a_missing_parameter_file_ends_the_command_with_one_line_and_status_2(tmp_path):
    root = Path(__file__).resolve().parents[1]  # the repository: the subprocess imports its paperlib
    done = subprocess.run(
        [sys.executable, "-m", "paperlib", "finetune", "-f", str(tmp_path / "missing.yaml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "parameter file not found" in one_error_line(done.stderr) and "Traceback" not in done.stderr


HELP_WITHOUT_TORCH = """
import contextlib, io, json, sys
from paperlib import __main__ as entry
found = []
for argv in json.loads(sys.argv[1]):
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        try:
            code = entry.main(argv)
        except SystemExit as stop:
            code = stop.code
    heavy = sorted(name for name in ("torch", "timm", "torchvision", "scipy") if name in sys.modules)
    found.append([argv, code, heavy, said.getvalue()])
print(json.dumps(found))
"""


def test_every_commands_help_and_a_mistyped_option_load_no_torch_and_print_plain_text():
    # --help of every command and subcommand, in a fresh process: nothing a command's module imports (torch) loads
    assert set(commands.PARSERS) == set(entry.COMMANDS)
    words = [["--help"], *([name, "--help"] for name in entry.COMMANDS)]
    words += [["sweep", "parameters/sweeps/finetune_demo.yaml", "--help"], ["finetune", "--no-such-option", "1"]]
    words += [
        [name, sub, "--help"]
        for name, subs in (("report", ("demo", "inplace")), ("demo", ("pretrain", "evaluate")))
        for sub in subs
    ]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", HELP_WITHOUT_TORCH, json.dumps(words)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=True,
    )
    for argv, code, heavy, text in json.loads(done.stdout):
        assert code == (2 if "--no-such-option" in argv else 0) and heavy == [], (argv, code, heavy)
        assert text.startswith("usage: python -m paperlib") and "``" not in text, (argv, text)
        assert "no-such-option" in text or len(text.splitlines()) > 3, (argv, text)
    sweep_help = " ".join(
        next(text for argv, _, _, text in json.loads(done.stdout) if argv == ["sweep", "--help"]).split()
    )
    for said in (
        "notebook",
        "parameters",
        "grid",
        "name",
        "slurm",
        "reports/<notebook>/",
        ".done.json",
        "VIT_PLASTICITY_WORKERS",
    ):
        assert said in sweep_help, said


# --- values refused before any file is touched ------------------------------------------------------

SHORT = ["--steps", "4", "--warmup", "1", "--eval-every", "2", "--batch-size", "8"]


def checksums(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_refused_value_leaves_a_finished_run_byte_identical(tmp_path, capsys, move_results):
    move_results(".")
    assert finetune.main(SHORT) == 0
    folder = Config(steps=4, warmup=1, eval_every=2, batch_size=8).folder()
    before = checksums(folder)
    assert {"params.json", "metrics.json", "history.csv"} <= set(before)
    capsys.readouterr()
    assert finetune.main([*SHORT, "--momentum", "-5"]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: momentum must be a number in [0, 1), got -5.0"
    assert checksums(folder) == before


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--micro-batch", "-1", "micro_batch must be 0 (automatic) or 1..batch_size (1..8), got -1"),
        ("--micro-batch", "16", "micro_batch must be 0 (automatic) or 1..batch_size (1..8), got 16"),
        ("--clip", "0", "clip must be a positive number (the gradient-norm bound; inf: no clipping), got 0.0"),
        ("--clip", "-1", "clip must be a positive number"),
        ("--clip", "nan", "clip must be a positive number"),
        ("--momentum", "nan", "momentum must be a number in [0, 1), got nan"),
        ("--momentum", "1", "momentum must be a number in [0, 1)"),
        ("--warmup", "4", "warmup must be an integer in 0..steps-1 (0..3), got 4"),
        ("--eval-every", "0", "eval_every must be a positive integer, got 0"),
        ("--seed", "-1", "seed must be a non-negative integer, got -1"),
        ("--image-size", "-3", "image_size must be 0 (the model's) or a positive integer"),
        ("--batch-size", "100000", "batch_size must be at most the training set of digits (573 images), got 100000"),
        ("--device", "gpu", "unknown device 'gpu'; valid devices: cpu, cuda, cuda:<index> (here: cpu"),
        ("--weight-decay", "-1", "weight_decay"),
    ],
)
def test_bad_values_stop_in_one_line_and_write_nothing(option, value, message, tmp_path, capsys, move_results):
    root = move_results("results")
    shorter = [part for i, part in enumerate(SHORT) if option not in SHORT[i - 1 : i + 1]]  # the value asked wins
    assert finetune.main([*shorter, option, value]) == 2
    assert message in one_error_line(capsys.readouterr().err)
    assert not root.exists()  # nothing written: no folder, no lock


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_a_gpu_this_machine_lacks_is_refused_before_any_data_is_read(capsys, move_results, monkeypatch):
    root = move_results("results")
    read = []
    monkeypatch.setattr(datasets, "read_split", lambda *a, **k: read.append(a) or pytest.fail("data read"))
    assert finetune.main([*SHORT, "--device", "cuda"]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: device 'cuda' is not on this machine; devices here: cpu"
    assert plasticity.main(["--device", "cuda", "--n-pairs", "4", "--progress", "false"]) == 2
    assert "device 'cuda' is not on this machine" in one_error_line(capsys.readouterr().err)
    assert not read and not root.exists()


def test_an_empty_parameter_file_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    assert finetune.main(["-f", str(empty)]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {empty} is empty: no parameters in it"


def test_finetune_help_gives_every_option_a_meaning_a_type_and_a_default(capsys):
    with pytest.raises(SystemExit) as done:
        finetune.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    comments = Config.comments()
    for name, default in Config.defaults().items():  # its fields, its method's name and every method's options
        option = f"--{name.replace('_', '-')}"
        meaning = " ".join(comments[name].split())
        assert meaning, f"Config's {name} has no comment for --help"
        assert f"{option} " in text and f"{meaning} (" in text and f"default {shown(default)})" in text, option
    assert (
        "(float; default 0.03)" in text and "--wait BOOL" in text and "status 75) (true or false; default True)" in text
    )


TYPE_WORDS = {None: "str", str: "str", int: "int", float: "float", Path: "path"}
"""How ``--help`` names the type of an argument's values (``add_argument``'s ``type``)."""


def help_line(text: str, invocation: str) -> str:
    """The help of the argument that ``--help`` lists as ``invocation`` (its first option, or its name), on one
    line: beside it, or on the next line, further indented, when the invocation is long ("" if it has none)."""
    lines = text.split("\n\n", 1)[1].splitlines()  # after the usage
    for at, line in enumerate(lines):
        if line.startswith("  ") and line.split()[0].rstrip(",") == invocation:
            beside = line.strip().split("  ", 1)
            if len(beside) == 2:
                return beside[1].strip()
            below = lines[at + 1] if at + 1 < len(lines) else ""
            indented = len(below) - len(below.lstrip()) > len(line) - len(line.lstrip())
            return below.strip() if indented and not below.strip().startswith("-") else ""
    raise AssertionError(f"{invocation} is not in --help:\n{text}")


MAINS = {
    "sweep": sweep.main,
    "stats": summary.main,
    "precision": precision_check.main,
    "report": execute.main,
    "demo": demo.main,
}
"""The commands that declare their options with ``add_argument``: each one's ``main``."""


@pytest.mark.parametrize("command", MAINS)
def test_help_gives_every_argument_a_meaning_a_type_its_choices_and_its_default(command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per argument
    main = MAINS[command]
    todo = [([], commands.PARSERS[command]())]  # the command, then each of its subcommands
    while todo:
        words, parser = todo.pop()
        with pytest.raises(SystemExit) as done:
            main([*words, "--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert parser.description and " ".join(parser.description.split()) in " ".join(text.split())
        for action in parser._actions:
            where = f"{' '.join([command, *words])} {action.dest}"
            if isinstance(action, argparse._SubParsersAction):
                for name, subcommand in action.choices.items():
                    assert help_line(text, name), f"{where}: subcommand {name} has no help"
                    todo.append(([*words, name], subcommand))
                continue
            if action.default is argparse.SUPPRESS:  # --help
                continue
            assert action.help, f"{where} has no help"
            meaning, _, facts = help_line(text, (action.option_strings or [action.dest])[0]).rpartition(" (")
            facts = facts.removesuffix(")").split("; ")
            assert meaning.strip(), f"{where} has no meaning in --help"
            if action.nargs == 0:
                assert facts == ["flag"], where
                continue
            assert facts[0] == TYPE_WORDS[action.type] + (", one or more" if action.nargs == "+" else ""), where
            if action.choices is not None:
                assert f"one of {', '.join(action.choices)}" in facts, where
            if action.required:
                assert not any(fact.startswith("default") for fact in facts), where
            else:  # a default value, or what leaving it out does in words
                said = [fact for fact in facts if fact.startswith("default")]
                in_words = len(said) == 1 and said[0].startswith("default: ") and said[0] != "default: "
                value = action.default is not None and said == [f"default {action.default}"]
                assert value or in_words, f"{where}: no default in --help"
