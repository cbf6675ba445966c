"""Interruptions, damaged files and runs that share a machine or a folder.

Processes are killed with SIGKILL at points chosen by watching the files they write, files are cut
short, and identical runs and sweeps are started together, at demo scale. Each case ends with the
results of an undisturbed run, or a clear error that names the file; nothing half-written is ever
taken as finished.
"""

import errno
import json
import math
import os
import pickle
import pickletools
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import interrupted, recorded_difference, resumed, same_metrics

from paperlib.analysis import plasticity_table, summary, tables
from paperlib.data import datasets, fixtures
from paperlib.data.loader import uint8_images
from paperlib.measure import plasticity, probe
from paperlib.records import measurements, paths, readings, runs, runs_table, specs, storage
from paperlib.records.names import COMPONENTS
from paperlib.speed import threads
from paperlib.sweeps import sweep
from paperlib.train import checkpoints, finetune, pool
from paperlib.train.config import Config

ROOT = Path(__file__).resolve().parents[1]  # the repository: subprocesses import its paperlib

# a run of the demo world that lasts a few seconds in a subprocess, with a checkpoint every 5 steps: three before
# its end, as many as the kill test's points need (most of a subprocess's time is its imports, not these steps)
RUN = {"component": "fc1", "steps": 20, "batch_size": 16, "warmup": 2, "eval_every": 5, "lr": 0.05}
ARGS = [part for name, value in RUN.items() for part in (f"--{name.replace('_', '-')}", str(value))]


def environment() -> dict:
    """This process's environment for a subprocess: the same results root, this checkout's paperlib,
    and no worker count (a lone process keeps PyTorch's threads, as this one does)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(threads.WORKERS, None)
    return env


def python(*arguments: str, **pipes) -> subprocess.Popen:
    """``python <arguments>`` from the repository in a session of its own (killing it kills what it
    started too), its stdout piped as text; ``pipes``: ``stdin`` or ``stderr`` piped too."""
    return subprocess.Popen(
        [sys.executable, *arguments],
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **pipes,
    )


def start(*command: str) -> subprocess.Popen:
    """``python -m <command>``, its stdout and stderr piped (``python``)."""
    return python("-m", *command, stderr=subprocess.PIPE)


def finished(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def kill_when(condition, process: subprocess.Popen, timeout: float = 240) -> None:
    """SIGKILL ``process`` (and its session) as soon as ``condition()`` holds; fails if it ended first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the process ended before the point to kill it at: {process.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the point to kill the process at never came")
        time.sleep(0.002)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL


def modified(file: Path):
    """A condition: ``file`` is there and was written since now (a new checkpoint)."""
    before = file.stat().st_mtime_ns if file.exists() else None
    return lambda: file.exists() and file.stat().st_mtime_ns != before


def cut(file: Path) -> None:
    """Truncate ``file`` to half its size, as a copy or a disk cut short would leave it."""
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def changed(file: Path) -> None:
    """Change one digit of ``file`` to another, its size kept: a number silently other, as bit rot or a bad copy
    leaves it (in a JSON record, the first number's; elsewhere the middle digit's)."""
    data = bytearray(file.read_bytes())
    digits = [i for i, byte in enumerate(data) if byte in b"0123456789"]
    at = next(i for i in digits if data[i - 2 : i] == b": ") if file.suffix == ".json" else digits[len(digits) // 2]
    data[at] = ord("0") + (data[at] - ord("0") + 1) % 10
    file.write_bytes(bytes(data))


def not_utf8(file: Path) -> None:
    """Replace the middle byte of ``file`` by one that no UTF-8 text holds, its size kept."""
    data = bytearray(file.read_bytes())
    data[len(data) // 2] = 0xFF
    file.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    """``RUN`` trained undisturbed in this process, under a results root of its own: (metrics, history).
    Trained once for the tests that compare with it (a run seeds itself: the same numbers every time)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path_factory.mktemp("undisturbed")))
        return finetune.run(Config(**RUN)), runs.history(Config(**RUN))


@pytest.fixture
def reference(undisturbed, move_results):
    """``undisturbed``'s (metrics, history), copies; the results root moves to ``disturbed`` for the
    test's own runs."""
    move_results("disturbed")
    return dict(undisturbed[0]), undisturbed[1].copy()


# --- kill -9 ---------------------------------------------------------------------------------------


def test_a_run_killed_at_several_points_ends_as_an_undisturbed_run(reference):
    folder = Config(**RUN).folder()
    # when it has recorded its parameters (data and model loaded), before its first checkpoint
    kill_when(lambda: (folder / runs.PARAMS).exists(), start("paperlib", "finetune", *ARGS))
    assert not (folder / runs.METRICS).exists()
    # after its first checkpoint
    kill_when(lambda: (folder / runs.CHECKPOINT).exists(), start("paperlib", "finetune", *ARGS))
    assert not (folder / runs.METRICS).exists()
    # resumed, after a checkpoint of its own
    kill_when(modified(folder / runs.CHECKPOINT), start("paperlib", "finetune", *ARGS))
    assert not (folder / runs.METRICS).exists()
    code, out, err = finished(start("paperlib", "finetune", *ARGS))
    assert code == 0, err
    assert same_metrics(json.loads(out)) == same_metrics({"folder": paths.display(folder), **reference[0]})
    pd.testing.assert_frame_equal(runs.history(Config(**RUN)), reference[1])
    assert not (folder / runs.CHECKPOINT).exists() and runs.is_finished(Config(**RUN))


def test_a_run_waiting_for_one_that_is_killed_takes_over_and_finishes_it(reference):
    folder = Config(**RUN).folder()
    first = start("paperlib", "finetune", *ARGS)
    deadline = time.monotonic() + 240
    while not (folder / runs.CHECKPOINT).exists():
        assert first.poll() is None and time.monotonic() < deadline, "the first run ended before its first checkpoint"
        time.sleep(0.002)
    os.killpg(first.pid, signal.SIGSTOP)  # frozen mid-run, holding the run's lock, while the second starts
    second = start("paperlib", "finetune", *ARGS)
    while "waiting for another process" not in second.stderr.readline():
        assert second.poll() is None, "the second run did not wait for the first"
    kill_when(lambda: True, first)
    code, out, err = finished(second)
    assert code == 0, err
    assert same_metrics(json.loads(out)) == same_metrics({"folder": paths.display(folder), **reference[0]})
    pd.testing.assert_frame_equal(runs.history(Config(**RUN)), reference[1])


# --- two at once -----------------------------------------------------------------------------------


def test_two_identical_runs_started_together_train_once_and_both_report_it(reference):
    both = [start("paperlib", "finetune", *ARGS) for _ in range(2)]
    ended = [finished(process) for process in both]
    assert [code for code, _, _ in ended] == [0, 0], [err[-2000:] for _, _, err in ended]
    results = [json.loads(out) for _, out, _ in ended]
    assert same_metrics(results[0]) == same_metrics(results[1])
    assert same_metrics(results[0]) == same_metrics({"folder": results[0]["folder"], **reference[0]})
    trained = [f"step {RUN['steps']:6d}" in err for _, _, err in ended]
    assert sorted(trained) == [False, True]  # one trained, the other reported its result


HOLD = (
    "import sys\nfrom paperlib.records import storage\n"
    "with storage.locked(sys.argv[1]):\n    print(1, flush=True)\n    input()\n"
)
"""A process that holds the lock of ``argv[1]`` until it reads a line."""


def hold(target: Path) -> subprocess.Popen:
    """A process of its own session that has taken the lock of ``target`` (``HOLD``); a line on its
    stdin lets go."""
    holder = python("-c", HOLD, str(target), stdin=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "1"
    return holder


def test_a_run_asked_not_to_wait_says_it_runs_elsewhere(capsys):
    config = Config(**RUN)
    holder = hold(config.folder())  # another process holds the run's lock
    try:
        with pytest.raises(storage.Busy, match="running elsewhere"):
            finetune.run(config, wait=False)
        assert finetune.main([*ARGS, "--wait", "false"]) == finetune.RUNNING_ELSEWHERE
        err = capsys.readouterr().err
        assert "running elsewhere" in err and paths.display(config.folder()) in err
        assert not (config.folder() / runs.PARAMS).exists()  # nothing started
    finally:
        holder.communicate("\n")


def test_a_lock_dies_with_its_process_and_is_reentrant_within_one(tmp_path):
    target = tmp_path / "folder"
    holder = hold(target)
    with pytest.raises(storage.Busy, match="folder is being written by another process"):
        with storage.locked(target, wait=False):
            pass
    kill_when(lambda: True, holder)  # kill -9: no stale lock left
    with storage.locked(target, wait=False), storage.locked(target, wait=False):  # taken, and taken again inside
        pass


def tiny_sweep(write_notebook, tmp_path: Path, values=(1, 2, 3)) -> tuple[Path, Path]:
    """A sweep spec of a notebook that logs its start and end to a file: (spec file, log)."""
    log = tmp_path / "executions.log"
    write_notebook(
        tmp_path / "logged.ipynb",
        "import time\nopen(log, 'a').write(f'start {value}\\n')\ntime.sleep(0.5)\n"
        "open(log, 'a').write(f'end {value}\\n')",
        parameters='value = 1\nlog = ""',
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "notebook": str(tmp_path / "logged.ipynb"),
                "parameters": {"log": str(log)},
                "grid": {"value": list(values)},
            }
        )
    )
    return spec, log


def executions(log: Path) -> list[str]:
    return log.read_text().split("\n")[:-1] if log.exists() else []


def test_two_identical_sweeps_started_together_execute_each_run_once(tmp_path, monkeypatch, write_notebook):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    spec, log = tiny_sweep(write_notebook, tmp_path)
    both = [start("paperlib", "sweep", str(spec)) for _ in range(2)]
    ended = [finished(process) for process in both]
    assert [code for code, _, _ in ended] == [0, 0], [err[-2000:] for _, _, err in ended]
    assert sorted(line for line in executions(log) if line.startswith("start")) == ["start 1", "start 2", "start 3"]
    assert all(run.finished for run in sweep.expand(specs.load_spec(spec)))
    said = [sweep_summary(out) for _, out, _ in ended]  # each run done by one, finished by the other for the other
    assert all(sorted([said[0][v], said[1][v]]) in (["done", "other"], ["done", "skipped"]) for v in "123"), said


def sweep_summary(out: str) -> dict[str, str]:
    """A sweep's summary lines as {run: status}."""
    lines = [line.split() for line in out.splitlines()]
    return {words[1]: words[0] for words in lines if len(words) > 1 and words[0] in sweep.STATUSES}


FINISH = (
    "import sys\nfrom paperlib.records import specs, storage\nfrom paperlib.sweeps import sweep\n"
    "run = sweep.expand(specs.load_spec(sys.argv[1]))[0]\n"
    "with storage.locked(run.stem):\n    print(1, flush=True)\n    input()\n    sweep.execute_run(run)\n"
)
"""A process that holds the lock of the first run of the spec ``argv[1]`` and, once it reads a line, runs it."""


def test_a_sweep_passes_over_a_run_another_process_holds_and_comes_back_to_it(tmp_path, monkeypatch, write_notebook):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    spec, log = tiny_sweep(write_notebook, tmp_path)
    holder = python("-c", FINISH, str(spec), stdin=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "1"
    sweeping = start("paperlib", "sweep", str(spec))
    deadline = time.monotonic() + 240  # a bound for a failure, not a timing: the sweep waits at the end, not at run 1
    try:
        while not all((tmp_path / "reports" / "logged" / f"{value}.done.json").exists() for value in (2, 3)):
            assert sweeping.poll() is None and time.monotonic() < deadline, "the runs after the held one never ran"
            time.sleep(0.05)
    except AssertionError:
        for process in (sweeping, holder):
            os.killpg(process.pid, signal.SIGKILL)
        raise
    assert executions(log).count("start 1") == 0
    holder.communicate("\n")  # the holder runs it, then lets go; the sweep, come back to it, finds it finished
    code, out, err = finished(sweeping)
    assert code == 0, err
    assert sweep_summary(out) == {"1": "other", "2": "done", "3": "done"}, out
    assert "finished by another process" in next(line for line in out.splitlines() if line.startswith("other"))
    assert executions(log).count("start 1") == 1


def test_a_sweep_killed_during_a_run_and_after_one_finishes_it_on_restart(tmp_path, monkeypatch, write_notebook):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    spec, log = tiny_sweep(write_notebook, tmp_path)
    folder = tmp_path / "reports" / "logged"
    # while its first run executes: that run has no marker, and runs again
    kill_when(lambda: "start 1" in executions(log), start("paperlib", "sweep", str(spec)))
    assert not (folder / "1.done.json").exists()
    # just after a run's marker: that run is finished and is not run again
    kill_when(lambda: (folder / "1.done.json").exists(), start("paperlib", "sweep", str(spec)))
    time.sleep(1.5)  # a killed sweep's kernel notices its parent is gone within a second, and ends
    ran_before = executions(log).count("start 1")
    code, out, err = finished(start("paperlib", "sweep", str(spec)))
    assert code == 0, err
    status = {words[1]: words[0] for words in map(str.split, out.splitlines()) if words[:1] in (["done"], ["skipped"])}
    assert status == {"1": "skipped", "2": "done", "3": "done"}, out
    assert executions(log).count("start 1") == ran_before == 2  # killed once while running, then finished
    for value in (1, 2, 3):
        json.loads((folder / f"{value}.done.json").read_text())  # every marker whole
    assert not list(folder.glob(".*.partial.ipynb"))


# --- files cut short ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", [cut, changed])
@pytest.mark.parametrize("name", [runs.PARAMS, runs.METRICS, runs.HISTORY, runs.WEIGHTS])
def test_a_finished_runs_damaged_file_is_not_taken_as_finished_and_the_run_trains_again(name, damage, small):
    config = small(save_weights=True)
    metrics = finetune.run(config)
    history = runs.history(config)
    damage(config.folder() / name)
    pattern = name.replace(".", r"\.")
    with pytest.raises(ValueError, match=pattern):  # read as a result, it is named
        checkpoints.load_model(config)
    with pytest.warns(UserWarning, match=pattern):
        assert not runs.is_finished(config)
    with pytest.warns(UserWarning, match=pattern):
        again = finetune.run(config)
    assert same_metrics(again) == same_metrics(metrics) and runs.is_finished(config)
    pd.testing.assert_frame_equal(runs.history(config), history)


def test_a_run_of_an_earlier_protocol_is_kept_labelled_and_trained_again_only_when_asked(small, monkeypatch):
    # a run that another training protocol made (other splits, another warm-up) is a user's result all the same
    config = small()
    metrics = finetune.run(config)
    params_file = config.folder() / runs.PARAMS
    params = json.loads(params_file.read_text())
    assert (params["training"], params["record"]) == (runs.TRAINING, runs.RECORD) and runs.is_finished(config)
    params = {key: value for key, value in params.items() if key not in runs.VERSIONS} | {"protocol": 2}
    storage.write_json(params_file, params)  # as protocol 2 wrote it: one number for training and record
    kept = runs.finished(config)  # kept, never trained again unasked, its accuracies read as what they were: exact
    assert kept["test_accuracy_exact"] == metrics["test_accuracy"] and math.isnan(kept["test_accuracy"])
    table = runs_table.load()
    assert table["status"].tolist() == ["finished"]
    assert table["lacks"].tolist() == ["trained by protocol 2; exact accuracies alone; no per-image outcomes"]
    monkeypatch.setenv(paths.RETRAIN_OLDER, "1")  # sweep --retrain-older
    assert not runs.is_finished(config)
    again = finetune.run(config)
    assert same_metrics(again) == same_metrics(metrics) and runs.is_finished(config)
    assert runs_table.load()["lacks"].tolist() == [""]
    params = json.loads(params_file.read_text()) | {"graph": False}  # a field Config does not have: another run
    storage.write_json(params_file, params)
    assert not runs.is_finished(config) and recorded_difference(config) == ["graph"]


def test_damaged_runs_are_partial_in_the_results_table(small):
    finetune.run(small())
    finetune.run(small(seed=1))
    cut(small(seed=1).folder() / runs.HISTORY)
    with pytest.warns(UserWarning, match="history.csv"):
        table = runs_table.load()
    histories = runs_table.histories_of(table)
    assert dict(zip(table["seed"], table["status"])) == {0: "finished", 1: "partial"}
    assert set(histories["seed"]) == {0}


def test_a_cut_checkpoint_is_reported_and_the_run_starts_from_the_beginning(small, monkeypatch, move_results):
    config = small()
    metrics = finetune.run(config)
    move_results("interrupted")
    interrupted(config, 9, monkeypatch)
    cut(config.folder() / runs.CHECKPOINT)
    with pytest.warns(UserWarning, match=r"checkpoint\.pt cannot be read.*from the beginning"):
        with pytest.raises(AssertionError, match="from the beginning"):  # it did not resume
            resumed(config, monkeypatch)
    assert same_metrics(storage.read_json(config.folder() / runs.METRICS)) == same_metrics(metrics)


def test_a_checkpoint_that_would_run_code_is_refused(small, monkeypatch, tmp_path, move_results):
    config = small()
    metrics = finetune.run(config)
    move_results("interrupted")
    interrupted(config, 9, monkeypatch)
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    saved = torch.load(config.folder() / runs.CHECKPOINT, weights_only=True)
    torch.save({**saved, "history": Payload()}, config.folder() / runs.CHECKPOINT)
    with pytest.warns(UserWarning, match=r"checkpoint\.pt cannot be read"):
        again = finetune.run(config)
    assert not marker.exists() and same_metrics(again) == same_metrics(metrics)


def test_a_cut_decoded_cache_is_decoded_again(tmp_path):
    fixtures.write_pets(tmp_path / "root")
    dataset = datasets.get_dataset("pets", "test", root=tmp_path / "root")
    first = uint8_images(dataset, cache_size=24, cache_dir=tmp_path / "cache")
    for file in sorted((tmp_path / "cache").rglob("*.npy")):  # its sizes, then its pixels
        cut(file)
        with pytest.warns(UserWarning, match="not whole: decoding again"):
            again = uint8_images(dataset, cache_size=24, cache_dir=tmp_path / "cache")
        assert torch.equal(again.images.pixels, first.images.pixels)
        assert torch.equal(again.images.sizes, first.images.sizes)


DECODER = """
import os, sys
from pathlib import Path
from paperlib.data import datasets, loader

def paused(*args, **kwargs):  # the holder stops inside the cache's lock, before the first image
    print("decoding", flush=True)
    input()
    return original(*args, **kwargs)

def refused(*args, **kwargs):
    sys.exit("decoded again")

original = loader.DataLoader
loader.DataLoader = paused if sys.argv[3] == "holder" else refused
loader.uint8_images(datasets.get_dataset("pets", "test", root=sys.argv[1]), cache_size=24, cache_dir=sys.argv[2])
pixels = next(p for p in Path(sys.argv[2]).rglob("*.npy") if not p.name.endswith("-sizes.npy"))
print(os.stat(pixels).st_ino, flush=True)
"""


def test_a_process_waiting_for_a_cache_reads_the_one_the_other_made(tmp_path):
    fixtures.write_pets(tmp_path / "root")
    folders = [str(tmp_path / "root"), str(tmp_path / "cache")]
    holder = python("-c", DECODER, *folders, "holder", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "decoding"  # inside the lock, nothing cached yet
    waiter = python("-c", DECODER, *folders, "waiter", stderr=subprocess.PIPE)
    while "waiting for another process" not in waiter.stderr.readline():
        assert waiter.poll() is None, waiter.communicate()
    holder.stdin.write("\n")
    holder.stdin.flush()
    made, waited = finished(holder), finished(waiter)
    assert made[0] == 0 and waited[0] == 0, (made[2][-2000:], waited[2][-2000:])
    assert made[1].split()[-1] == waited[1].split()[-1]  # the waiter read the holder's file: it decoded nothing


def recorded(config: Config, accuracy: float) -> None:
    """``config``'s run recorded as finished with ``accuracy``, by the package's own writers, without training."""
    runs.start(config.folder(), runs.run_record(config))
    rows = [{"step": step, "lr": config.lr, "train_loss": 1 / step, "grad_norm": 1.0} for step in range(1, 11)]
    metrics = {"status": "finished", "best_val_accuracy": accuracy, "best_step": 10, "test_accuracy": accuracy}
    hits = np.arange(100) < 100 * accuracy  # what it saw: as many images right as its accuracy says
    seen = readings.Outcomes(np.array([10]), hits[None], hits[None], *np.zeros((2, 1)), np.zeros(1, bool))
    checkpoints.record(config.folder(), rows, seen, (None, 10), metrics)


def finetuned(tmp_path: Path) -> Path:
    """A spec of the five components on the demo's digits, each run recorded (``recorded``): what ``stats`` reads."""
    for rank, component in enumerate(COMPONENTS):
        recorded(Config(component=component, lr=0.03), 0.9 - rank / 50)
    spec = tmp_path / "finetune.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"notebook": "notebooks/05_finetune.ipynb", "name": "{component}", "grid": {"component": list(COMPONENTS)}}
        )
    )
    return spec


MEASURES = (
    "from paperlib.measure import plasticity\nplasticity.run(plasticity.Measurement(model, dataset, n_pairs=n_pairs))"
)
"""A notebook 02 that measures its parameters' result, and nothing else."""


@pytest.mark.parametrize("name, damage", [(measurements.RATES, cut), (measurements.BLOCKS, not_utf8)])
def test_a_damaged_plasticity_result_is_named_by_stats_and_measured_again_by_its_sweep(
    name, damage, tmp_path, monkeypatch, write_notebook
):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    notebook = tmp_path / "02_plasticity.ipynb"
    write_notebook(notebook, MEASURES, parameters='model = "demo"\ndataset = "digits"\nn_pairs = 6')
    spec = tmp_path / "plasticity.yaml"
    spec.write_text(yaml.safe_dump({"notebook": str(notebook), "name": "{dataset}", "grid": {"dataset": ["digits"]}}))
    assert [run.status for run in sweep.run_sweep(specs.load_spec(spec))] == ["done"]
    measurement = plasticity.Measurement(n_pairs=6)
    folder = measurement.folder()
    table, per_block = plasticity_table.load(folder), plasticity_table.blocks(folder)
    stats = ["paperlib", "stats", str(finetuned(tmp_path))]
    damage(folder / name)
    status, out, err = finished(start(*stats))  # every table, without the damaged result
    assert status == 0 and "Table 6" in out
    assert err.startswith(f"warning: {paths.display(folder / name)} is not the file") and err.count("\n") == 1, err
    assert "left out" in err
    read = plasticity_table.load if name == measurements.RATES else plasticity_table.blocks
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):  # read as a result, it is named
        read(folder)
    with pytest.warns(UserWarning, match=name.replace(".", r"\.")):  # the next sweep measures it again
        assert [run.status for run in sweep.run_sweep(specs.load_spec(spec))] == ["done"]
    assert measurement.is_saved() and finished(start(*stats))[::2] == (0, "")
    pd.testing.assert_frame_equal(plasticity_table.load(folder), table)
    pd.testing.assert_frame_equal(plasticity_table.blocks(folder), per_block)
    cut(folder / measurements.METADATA)
    with pytest.raises(ValueError, match=r"metadata\.json is not whole JSON"):
        plasticity_table.load(folder)


@pytest.mark.parametrize("name", [runs.METRICS, runs.HISTORY])
def test_a_runs_file_changed_in_place_is_named_in_one_line_by_the_first_command_that_reads_it(name, tmp_path):
    spec = finetuned(tmp_path)
    damaged = Config(component="fc1", lr=0.03)
    changed(damaged.folder() / name)
    # the tables read a run's metrics; the sweep's plan, whether it is finished, its history too
    first = ["stats", str(spec)] if name == runs.METRICS else ["sweep", str(spec), "--plan"]
    status, out, err = finished(start("paperlib", *first))
    warned = [line for line in err.splitlines() if "warning" in line or name in line]  # a plan also says it times
    assert status == 0 and len(warned) == 1 and "Traceback" not in err, err
    assert warned[0].startswith(f"warning: {paths.display(damaged.folder() / name)} is not the")
    assert "4 finished, 1 partial" in out if name == runs.METRICS else "total      5         4" in out
    with pytest.warns(UserWarning, match=name.replace(".", r"\.")):
        assert not runs.is_finished(damaged)  # what the sweep and the notebooks ask: trained again
    with pytest.warns(UserWarning, match=name.replace(".", r"\.")):
        assert set(runs_table.histories_of(runs_table.load())["component"]) == set(COMPONENTS) - {"fc1"}


def test_results_written_before_checksums_are_read_and_upgraded_in_place(small):
    config = small()
    metrics = finetune.run(config)
    folder = config.folder()
    # as record 4 wrote them: one protocol number, the sizes of the files alone, no checksum of their own
    params = storage.read_json(folder / runs.PARAMS)
    params = {key: value for key, value in params.items() if key not in runs.VERSIONS} | {"protocol": 4}
    (folder / runs.PARAMS).write_text(json.dumps(params))
    older = storage.read_json(folder / runs.METRICS)
    older["files"] = {name: kept["bytes"] for name, kept in older["files"].items() if name != readings.OUTCOMES}
    (folder / readings.OUTCOMES).unlink()
    (folder / runs.METRICS).write_text(json.dumps(older))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # older, not damaged: no warning
        assert runs.finished(config)["test_accuracy"] == metrics["test_accuracy"]
        assert runs_table.load()["lacks"].tolist() == ["no checksums; no per-image outcomes"]
    with pytest.raises(ValueError, match="metrics.json records no checksum of .*history.csv: written by an earlier"):
        storage.read_json(folder / runs.METRICS, whole=True)
    history = (folder / runs.HISTORY).read_bytes()
    assert runs.upgrade(folder) and not runs.upgrade(folder)  # once: then it is a record 5
    assert storage.read_json(folder / runs.METRICS, whole=True)["test_accuracy"] == metrics["test_accuracy"]
    assert (folder / runs.HISTORY).read_bytes() == history
    assert runs_table.load()["lacks"].tolist() == ["no per-image outcomes"]
    # a record 5 whose checksum was taken away is damaged, not older
    payload = json.loads((folder / runs.METRICS).read_text())
    del payload["sha256"]
    (folder / runs.METRICS).write_text(json.dumps(payload))
    with pytest.warns(UserWarning, match=r"metrics\.json carries no checksum \(sha256\)"):
        assert not runs.is_finished(config)


@pytest.mark.parametrize("damage", [cut, changed])
def test_a_damaged_probe_cache_is_fitted_again(damage):
    asked = probe.Probe("demo", "digits", points=("mha",), blocks=-1)
    table = probe.linear_probe(asked)
    folder = asked.folder()
    damage(folder / "probe.csv")
    with pytest.warns(UserWarning, match=r"probe\.csv"):
        again = probe.linear_probe(asked)
    pd.testing.assert_frame_equal(again, table)
    cut(folder / "metadata.json")
    with pytest.warns(UserWarning, match=r"metadata\.json is not whole JSON"):
        pd.testing.assert_frame_equal(probe.linear_probe(asked), table)


def test_a_cut_sweep_marker_is_not_finished(tmp_path, monkeypatch, write_notebook):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    spec, log = tiny_sweep(write_notebook, tmp_path, values=(1,))
    assert [run.status for run in sweep.run_sweep(specs.load_spec(spec))] == ["done"]
    (run,) = sweep.expand(specs.load_spec(spec))
    cut(run.marker)
    with pytest.warns(UserWarning, match=r"1\.done\.json is not whole JSON"):
        assert not run.finished
        assert [run.status for run in sweep.run_sweep(specs.load_spec(spec))] == ["done"]  # executed again
    assert json.loads(run.marker.read_text())["parameters"]["value"] == 1


# --- what is read -----------------------------------------------------------------------------------


def test_cifar_pickles_admit_only_arrays_and_plain_types(tmp_path):
    base = fixtures.write_cifar(tmp_path, n_train=10, n_test=10)
    # the fixture's files name what the official ones name (numpy 1's module) and nothing else
    written = (base / "test_batch").read_bytes()
    named = {arg for op, arg, _ in pickletools.genops(written) if "GLOBAL" in op.name}
    assert named == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
    assert len(datasets.get_dataset("cifar10", "test", root=tmp_path)) == 10
    # as a numpy 2 writes them again, too
    entry = {"data": np.zeros((10, 3072), dtype=np.uint8), "labels": list(range(10))}
    (base / "test_batch").write_bytes(pickle.dumps(entry, protocol=4))
    assert [int(label) for _, label in datasets.get_dataset("cifar10", "test", root=tmp_path)] == list(range(10))
    # anything else, which could run code, is refused with the file's name
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    (base / "test_batch").write_bytes(pickle.dumps({"data": Payload(), "labels": []}))
    with pytest.raises(ValueError, match=r"test_batch is not one of CIFAR's official files.*pathlib"):
        datasets.get_dataset("cifar10", "test", root=tmp_path)
    assert not marker.exists()
    cut(base / "batches.meta")
    with pytest.raises(ValueError, match=r"batches\.meta is not one of CIFAR's official files"):
        datasets.get_dataset("cifar10", "train", root=tmp_path)


def test_no_unrestricted_loading_in_the_package():
    source = {path: path.read_text() for path in (ROOT / "paperlib").rglob("*.py")}
    assert not [path for path, text in source.items() if "weights_only=False" in text]
    assert not [path for path, text in source.items() if "pickle.load(" in text or "pickle.loads(" in text]
    assert not [path for path, text in source.items() if "allow_pickle=True" in text]


# --- threads ---------------------------------------------------------------------------------------


def test_processes_that_share_the_cores_take_a_share_each(monkeypatch, small):
    monkeypatch.delenv(threads.WORKERS, raising=False)
    assert threads.workers() == 1 and threads.budget() is None  # alone: PyTorch's own choice stands
    monkeypatch.setenv(threads.WORKERS, "2")
    assert threads.budget() == max(1, threads.cores() // 2)
    monkeypatch.setenv(threads.WORKERS, str(4 * threads.cores()))
    assert threads.budget() == 1
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(threads.WORKERS, bad)
        with pytest.raises(ValueError, match="VIT_PLASTICITY_WORKERS must be a positive integer"):
            threads.budget()
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(threads.WORKERS, str(4 * threads.cores()))
        assert finetune.run(small())["threads"] == 1 == torch.get_num_threads()  # a run records what it used
    finally:
        torch.set_num_threads(before)
    with threads.shared_by(3):
        assert os.environ[threads.WORKERS] == "3"
    assert os.environ[threads.WORKERS] == str(4 * threads.cores())  # restored


def test_our_processes_wait_without_spinning_unless_told_otherwise():
    code = "import os, paperlib; print(os.environ['OMP_WAIT_POLICY'])"
    env = {key: value for key, value in environment().items() if key != "OMP_WAIT_POLICY"}
    check = {"cwd": ROOT, "capture_output": True, "text": True, "check": True}
    assert subprocess.run([sys.executable, "-c", code], env=env, **check).stdout.strip() == "PASSIVE"
    told = {**env, "OMP_WAIT_POLICY": "ACTIVE"}
    assert subprocess.run([sys.executable, "-c", code], env=told, **check).stdout.strip() == "ACTIVE"


# --- runs that explode, runs of other parameters in a spec's folder ---------------------------------


def test_an_exploded_run_is_diverged_and_stops_there_only_when_asked(small):
    # lr 1000 at demo scale: a loss far above chance level's (log 5), recorded diverged with its first step
    asked = small(lr=1000.0, steps=20, eval_every=5, stop_exploded=True)
    stopped = finetune.run(asked)
    assert stopped["status"] == "diverged" and stopped["diverged_step"] is not None
    history = runs.history(asked)
    assert history["step"].iloc[-1] == stopped["diverged_step"] <= 20
    assert history["train_loss"].iloc[-1] > finetune.EXPLODED * np.log(5)
    # the authors' loop (the default): the same run goes on past that step, to its end or to a loss that is not finite
    default = small(lr=1000.0, steps=20, eval_every=5)
    assert default.folder() == asked.folder() and not runs.is_finished(default)  # another run, trained again
    going_on = finetune.run(default)
    assert going_on["status"] == "diverged" and going_on["diverged_step"] == stopped["diverged_step"]
    history = runs.history(default)
    assert history["step"].iloc[-1] == 20 or not np.isfinite(history["train_loss"].iloc[-1])
    assert len(history) > stopped["diverged_step"] or not np.isfinite(history["train_loss"].iloc[-1])


class LossTurnsNaN:
    """A run's step whose loss and trainable weights turn NaN after ``after`` calls, as a run that diverges."""

    def __init__(self, step, after: int):
        self.step, self.after, self.calls = step, after, 0

    def __getattr__(self, name):
        return getattr(self.step, name)

    def __call__(self, images, labels):
        self.calls += 1
        loss, norm = self.step(images, labels)
        if self.calls <= self.after:
            return loss, norm
        with torch.no_grad():
            for parameter in self.step.trainable:
                parameter.fill_(float("nan"))
        return loss * float("nan"), norm


def test_a_run_that_diverges_after_its_best_validation_keeps_its_test_accuracy_and_can_be_chosen(small, monkeypatch):
    made = finetune.build_step
    monkeypatch.setattr(finetune, "build_step", lambda *a, **k: LossTurnsNaN(made(*a, **k), after=12))
    diverged = finetune.run(small(lr=0.03, steps=20, eval_every=5))
    monkeypatch.setattr(finetune, "build_step", made)
    assert diverged["status"] == "diverged" and diverged["diverged_step"] == 13
    assert diverged["best_step"] in (5, 10) and 0 < diverged["test_accuracy"] <= 1  # the checkpoint before the NaN
    still = finetune.run(small(lr=1e-6, steps=20, eval_every=5))  # learns next to nothing
    assert still["status"] == "finished" and still["test_accuracy"] < diverged["test_accuracy"]
    table = runs_table.load()
    assert table.set_index("lr").loc[0.03, "test_accuracy"] == diverged["test_accuracy"]
    assert tables.table6(table)["lr"].tolist() == [0.03]  # the authors' choice over every run


def test_a_run_of_other_parameters_in_a_specs_folder_is_not_the_specs(tmp_path, capsys, move_results):
    move_results(".")
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "name": "{component}/{lr}",
        "parameters": {"steps": 20, "warmup": 2, "eval_every": 10, "batch_size": 16},
        "grid": {"component": ["mha", "ln1"], "lr": [0.03]},
    }
    pool.run_spec(spec)
    found, missing = runs_table.for_spec(spec)
    assert found["status"].tolist() == ["finished", "finished"] and missing.empty
    longer = Config(component="mha", lr=0.03, steps=30, warmup=2, eval_every=10, batch_size=16)  # the CLI's, say
    finetune.run(longer)
    found, missing = runs_table.for_spec(spec)
    assert found["component"].tolist() == ["ln1"] and set(runs_table.histories_of(found)["component"]) == {"ln1"}
    assert missing[["component", "reason"]].values.tolist() == [["mha", "different parameters: steps"]]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert summary.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert f"1 runs of {path}: 1 finished; 1 missing (1 different parameters)" in out
    assert "different parameters: steps" in out
    assert "Table 1 needs finished MHA runs: none yet" in out
    table6 = out.split("Table 6: test accuracy (%) at the best learning rate")[1].split("Table 1")[0]
    assert "ln1" in table6 and "mha" not in table6  # Table 6 of the runs there are


def test_a_run_being_written_elsewhere_leaves_a_specs_counts_whole_numbers(move_results):
    move_results(".")
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"steps": 10, "warmup": 2, "eval_every": 5, "batch_size": 16},
        "grid": {"component": ["ln1"], "lr": [0.03]},
    }
    pool.run_spec(spec)
    other = Config(component="fc2", lr=0.03, steps=10, warmup=2, eval_every=5, batch_size=16)
    other.folder().mkdir(parents=True)
    storage.write_json(other.folder() / runs.PARAMS, runs.run_record(other))  # begun, no metrics yet
    assert runs_table.load()["trainable_parameters"].isna().any()  # the whole root: a partial run among them
    found, _ = runs_table.for_spec(spec)
    assert found["status"].tolist() == ["finished"]
    assert found["trainable_parameters"].dtype == "int64" and found["best_step"].dtype == "int64"


# --- one line, not a traceback: unreadable images, templates, disks that refuse -----------------------


def test_a_truncated_image_is_named_in_one_line(tmp_path, capsys, move_results):
    move_results("results")
    folder = fixtures.write_image_folder(tmp_path / "data" / "custom" / "mine", ["a", "b"], per_class=6)
    images = sorted(folder.rglob("*.jpg"))
    arguments = ["--dataset", "custom/mine", "--data-root", str(tmp_path / "data"), "--steps", "2", "--warmup", "0"]
    for broken, keep in ((images[3], 400), (images[7], 20)):  # the header reads, the pixels do not; nor the header
        broken.write_bytes(broken.read_bytes()[:keep])
        assert finetune.main([*arguments, "--eval-every", "1", "--batch-size", "4"]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"error: cannot read image {broken}: "), line
        broken.unlink()


def test_a_misspelt_key_in_a_specs_name_template_is_one_line(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "notebook: notebooks/05_finetune.ipynb\nname: '{datset}/{lr}'\nparameters: {steps: 4}\ngrid: {lr: [0.1]}\n"
    )
    for main in (sweep.main, summary.main):
        assert main([str(spec), *(["--dry-run"] if main is sweep.main else [])]) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith("error: the spec's name template '{datset}/{lr}' cannot be filled (KeyError: 'datset')")
        assert line.endswith("its keys can be: lr, steps") and "\n" not in line


def test_a_read_only_results_folder_is_named_in_one_line(tmp_path, capsys, move_results, monkeypatch):
    root = move_results("results")
    make = Path.mkdir

    def read_only(self, *args, **kwargs):  # the results root on a read-only file system (as root, chmod is no test)
        if self.is_relative_to(root):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return make(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert finetune.main(["--steps", "2", "--warmup", "0", "--eval-every", "1", "--batch-size", "4"]) == 2
    folder = Config().folder().parent
    assert capsys.readouterr().err.strip() == f"error: cannot write in {folder}: read-only file system"


def test_a_full_disk_says_no_space_left_and_which_file(tmp_path, monkeypatch):
    target = tmp_path / "run" / "checkpoint.pt"

    def torch_on_a_full_disk(tmp):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=4096))
    with pytest.raises(
        storage.CannotWrite, match=f"no space left on the device of {tmp_path / 'run'}: cannot write checkpoint.pt"
    ):
        storage.atomic_write(target, torch_on_a_full_disk)
    with pytest.raises(storage.CannotWrite, match="no space left"):  # an OSError that says so
        storage.atomic_write(target, lambda tmp: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    assert not list(target.parent.iterdir())  # no temporary file left
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="unexpected pos"):  # with room on the disk, the error as it is
        storage.atomic_write(target, torch_on_a_full_disk)
