"""What every command line answers besides its work: a key given twice in a YAML file, Ctrl-C, and
``python -m paperlib.<command>`` (earlier READMEs' entry point)."""

import importlib
import os
import signal
import subprocess
import sys
import time

import pytest

from paperlib.__main__ import COMMANDS, INTERRUPTED
from paperlib.records import cli, paths


def python(*args: str) -> subprocess.CompletedProcess:
    """``python <args>`` run in the checkout, its output as text."""
    return subprocess.run([sys.executable, *args], cwd=paths.ROOT, capture_output=True, text=True, timeout=120)


def test_read_yaml_refuses_a_key_given_twice_in_one_mapping(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("steps: 20\nlr: 0.01\nsteps: 30\n")
    with pytest.raises(ValueError, match=r"twice.yaml: the key 'steps' is given twice \(lines 1 and 3\)"):
        cli.read_yaml(twice)
    nested = tmp_path / "nested.yaml"
    nested.write_text("notebook: a.ipynb\nparameters:\n  steps: 20\n  seed: 0\n  steps: 30\n")
    with pytest.raises(ValueError, match=r"the key 'steps' is given twice \(lines 3 and 5\)"):
        cli.read_yaml(nested, "sweep spec")
    flow = tmp_path / "flow.yaml"
    flow.write_text("grid: {lr: [0.1], lr: [0.2]}\n")
    with pytest.raises(ValueError, match="the key 'lr' is given twice"):
        cli.read_yaml(flow)
    # one key in two mappings, and a key a merge brings set again, are no duplicates
    fine = tmp_path / "fine.yaml"
    fine.write_text("a: &base {steps: 1, lr: 2}\nb:\n  <<: *base\n  steps: 3\nc: {steps: 4}\n")
    assert cli.read_yaml(fine) == {"a": {"steps": 1, "lr": 2}, "b": {"steps": 3, "lr": 2}, "c": {"steps": 4}}


def test_a_spec_with_a_key_given_twice_is_refused_in_one_line(tmp_path):
    spec = tmp_path / "twice.yaml"
    spec.write_text(
        "notebook: notebooks/05_finetune.ipynb\nparameters:\n  steps: 20\n  steps: 30\ngrid:\n  lr: [0.01, 0.1]\n"
    )
    # stats reads a spec as sweep --plan does (specs.load_spec), without importing torch: in a second, not ten
    done = python("-m", "paperlib", "stats", str(spec))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"error: sweep spec {spec}: the key 'steps' is given twice (lines 3 and 4)"]


def test_ctrl_c_ends_a_command_in_one_line_and_the_run_resumes(tmp_path):
    results = tmp_path / "results"
    command = ["-m", "paperlib", "finetune", "--steps", "100000", "--eval-every", "5", "--batch-size", "8"]
    finetune = subprocess.Popen(
        [sys.executable, *command],
        cwd=paths.ROOT,
        env=os.environ | {"VIT_PLASTICITY_RESULTS": str(results)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a process started in the background by a shell ignores SIGINT, and so would this one: Ctrl-C's as a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not list(results.rglob("checkpoint.pt")):
            assert finetune.poll() is None, finetune.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no checkpoint in 120 s"
            time.sleep(0.2)
        finetune.send_signal(signal.SIGINT)
        _, stderr = finetune.communicate(timeout=60)
    finally:
        finetune.kill()
    assert finetune.returncode == 130 and "Traceback" not in stderr, stderr[-2000:]
    assert [line for line in stderr.splitlines() if line.strip()][-1] == INTERRUPTED
    assert list(results.rglob("checkpoint.pt"))  # what the same command resumes from


def test_python_m_paperlib_dot_a_command_names_the_command_to_type():
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", f"paperlib.{name}", "a.yaml", "--lr", "1e-2"],
            cwd=paths.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in COMMANDS
    }
    for name, run in runs.items():
        stdout, stderr = run.communicate(timeout=60)
        line = f"error: python -m paperlib.{name} is not a command; type: python -m paperlib {name} a.yaml --lr 1e-2"
        assert (run.returncode, stdout, stderr.splitlines()) == (2, "", [line])
    # imported from Python code, the same words and nothing run; real modules as they were, other names unknown
    with pytest.raises(ModuleNotFoundError, match=r"paperlib.sweep is not a module: .* python -m paperlib sweep"):
        importlib.import_module("paperlib.sweep")
    assert "paperlib.sweep" not in sys.modules
    assert importlib.util.find_spec("paperlib.sweeps.sweep").origin.endswith("sweep.py")
    unknown = python("-m", "paperlib.not_a_command")
    assert unknown.returncode == 1 and "No module named paperlib.not_a_command" in unknown.stderr
    helped = python("-m", "paperlib", "sweep", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m paperlib sweep")
