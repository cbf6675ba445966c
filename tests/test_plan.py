"""``python -m paperlib sweep SPEC --plan``: a sweep's runs counted and the device-hours of those to run,
with nothing trained or written."""

import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from paperlib import speed
from paperlib.records import paths, runs, specs, storage
from paperlib.sweeps import plan, sweep
from paperlib.train import finetune
from paperlib.train.config import Config, config_from, configs

DEMO_SPEC = str(paths.PARAMETERS / "sweeps" / "finetune_demo.yaml")
PLASTICITY_SPEC = str(paths.PARAMETERS / "sweeps" / "plasticity_demo.yaml")


@pytest.fixture
def reports(tmp_path, monkeypatch):
    """A reports root of the test's own (``VIT_PLASTICITY_REPORTS``), not made."""
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    return tmp_path / "reports"


def small_spec(steps: int = 20, components=("mha", "fc1"), seeds=(0,)) -> dict:
    """A finetuning spec of the demo ViT on digits: ``components`` x ``seeds`` runs of ``steps`` steps."""
    return {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"model": "demo", "steps": steps, "batch_size": 16, "warmup": 2, "eval_every": 4},
        "grid": {"dataset": ["digits"], "component": list(components), "lr": [0.03], "seed": list(seeds)},
    }


def fixed_rate(monkeypatch, rate: float = 1000.0) -> list:
    """``plan.time_step`` replaced by a step of ``rate`` images/s; returns the configs it was asked to time."""
    asked = []
    monkeypatch.setattr(plan, "time_step", lambda config, timing_steps=3: asked.append(config) or rate)
    return asked


def finish(config: Config, status: str = "finished", images_per_second: float = 100.0) -> None:
    """Record ``config``'s run as a run that ended with ``status`` (its files, as ``finetune`` writes them)."""
    storage.write_json(config.folder() / runs.PARAMS, runs.run_record(config))
    storage.write_json(
        config.folder() / runs.METRICS,
        {"status": status, "images_per_second": images_per_second, "device": "cpu", "best_step": 4},
    )


def contents(root: Path) -> dict:
    """Every file and folder under ``root``, with a file's bytes."""
    return {path: path.read_bytes() if path.is_file() else None for path in sorted(root.rglob("*"))}


def test_the_plan_of_the_demo_sweep_counts_its_runs_times_their_steps_and_writes_nothing(results, reports, capsys):
    assert sweep.main([DEMO_SPEC, "--plan"]) == 0
    out = capsys.readouterr().out
    total = next(line for line in out.splitlines() if line.startswith("total "))
    assert total.split() == ["total", "42", "0", "0", "0", "42"]  # runs, finished, diverged, failed, missing
    assert "estimate of the 42 runs to run" in out and "Not included: evaluation" in out
    hours = float(next(line for line in out.splitlines() if line.startswith("total:")).split()[1])
    assert math.isfinite(hours) and hours > 0
    assert not results.exists() and not reports.exists()


def test_every_distinct_step_is_timed_once_and_gives_a_positive_finite_rate(reports):
    estimate = plan.plan(sweep.expand(small_spec(seeds=(0, 1))), timing_steps=1)["estimate"]
    assert estimate["component"].tolist() == ["mha", "fc1"] and estimate["runs"].tolist() == [2, 2]
    assert all(math.isfinite(rate) and rate > 0 for rate in estimate["images_per_second"])
    assert estimate["source"].str.startswith("timed here").all()


def test_a_step_is_timed_as_the_run_makes_it_its_optimizer_included(monkeypatch):
    # the step that finetune trains with (train.step.build_step), with the run's optimizer and settings
    made = []
    original = speed.step.make_optimizer

    def spy(model, settings):
        made.append((settings.optimizer, settings.lr, settings.weight_decay))
        return original(model, settings)

    monkeypatch.setattr(speed.step, "make_optimizer", spy)
    config = Config(component="ln2", optimizer="adamw", lr=1e-3, weight_decay=0.05, batch_size=8, device="cpu")
    rate = plan.time_step(config, timing_steps=1)
    assert made == [("adamw", 1e-3, 0.05)] and math.isfinite(rate) and rate > 0


def test_the_estimate_grows_in_proportion_to_the_steps(reports, monkeypatch):
    fixed_rate(monkeypatch, 1000.0)
    short, long = (plan.plan(sweep.expand(small_spec(steps)))["estimate"] for steps in (20, 40))
    assert short["hours"].tolist() == [20 * 16 / 1000 / 3600] * 2
    assert long["hours"].sum() == 2 * short["hours"].sum()
    assert long["steps"].sum() == 2 * short["steps"].sum() == 80
    grid = small_spec()["grid"]
    both = {**small_spec(), "grid": [{**grid, "steps": [20]}, {**grid, "dataset": ["digits_c/snow"], "steps": [40]}]}
    both["parameters"].pop("steps")
    one_step = plan.plan(sweep.expand(both))["estimate"]  # a step's runs: of 20 steps on digits, of 40 on snow
    assert one_step["runs"].tolist() == [2, 2] and one_step["steps"].tolist() == [60, 60]
    assert one_step["hours"].sum() == pytest.approx(short["hours"].sum() + long["hours"].sum())


def test_finished_runs_are_counted_and_the_median_rate_of_their_step_is_used_without_a_change_to_the_results(
    results, reports, monkeypatch, capsys
):
    asked = fixed_rate(monkeypatch)
    spec = small_spec(components=("mha", "fc1"), seeds=(0, 1, 2, 3))
    mha = [config for config in configs(spec) if config.component == "mha"]
    for config, rate in zip(mha, (100.0, 200.0, 600.0)):
        finish(config, images_per_second=rate)
    finish(replace(mha[3], batch_size=8, tag="b8"), images_per_second=5.0)  # another step (batch): not its rate
    before = contents(results)

    result = plan.plan(sweep.expand(spec))
    assert result["counts"].loc["total"].to_dict() == {
        "runs": 8, "finished": 3, "diverged": 0, "failed": 0, "missing": 5
    }  # fmt: skip
    estimate = result["estimate"].set_index("component")
    assert estimate.loc["mha", "runs"] == 1 and estimate.loc["mha", "images_per_second"] == 200.0  # the median
    assert estimate.loc["mha", "source"] == "recorded (median of 3 runs)"
    assert estimate.loc["fc1", "source"].startswith("timed here")
    assert [config.component for config in asked] == ["fc1"]  # what was recorded is not timed
    spec_file = results.parent / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    assert sweep.main([str(spec_file), "--plan"]) == 0
    assert "recorded (median of 3 runs)" in capsys.readouterr().out
    assert contents(results) == before and not reports.exists()


def test_a_run_that_finetune_finished_lends_its_recorded_rate_to_the_other_runs_of_its_step(
    reports, monkeypatch, small
):
    asked = fixed_rate(monkeypatch)
    done = small(component="mha", seed=0)
    metrics = finetune.run(done)
    fixed = {name: getattr(done, name) for name in ("model", "steps", "batch_size", "warmup", "eval_every", "lr")}
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": fixed,
        "grid": {"component": ["mha"], "seed": [0, 1]},
    }
    result = plan.plan(sweep.expand(spec))
    assert result["counts"].loc["total", ["finished", "missing"]].tolist() == [1, 1]
    assert result["estimate"]["images_per_second"].tolist() == [metrics["images_per_second"]] and not asked


def test_diverged_runs_are_results_and_failed_runs_are_run_again(results, reports, monkeypatch):
    fixed_rate(monkeypatch)
    spec = small_spec(components=("mha", "fc1", "fc2"))
    diverged, failed, _ = configs(spec)
    finish(diverged, status="diverged")
    error_file = next(run for run in sweep.expand(spec) if "fc1" in run.name).error_file
    error_file.parent.mkdir(parents=True)
    error_file.write_text("RuntimeError: asked to fail\n")
    result = plan.plan(sweep.expand(spec))
    assert result["counts"].loc["digits"].to_dict() == {
        "runs": 3, "finished": 0, "diverged": 1, "failed": 1, "missing": 1
    }  # fmt: skip
    assert result["estimate"]["component"].tolist() == ["fc1", "fc2"]  # the failed and the missing run


def test_another_precision_is_planned_as_if_the_spec_asked_for_it(reports, monkeypatch, capsys):
    asked = fixed_rate(monkeypatch)
    assert sweep.main([DEMO_SPEC, "--plan", "--precision", "autocast"]) == 0
    out = capsys.readouterr().out
    assert "as if its precision were autocast" in out
    rows = out.split("component")[1].split("total:")[0].strip().splitlines()[1:]
    assert len(rows) == 7 and all(row.split()[0] == "autocast" for row in rows)
    assert {config.step.precision for config in asked} == {"autocast"}
    assert set(plan.plan(sweep.expand(small_spec()))["estimate"]["precision"]) == {"fp32"}  # the spec's own


def test_a_precision_the_device_lacks_is_a_one_line_error_naming_the_valid_ones(reports, capsys):
    assert sweep.main([DEMO_SPEC, "--plan", "--precision", "tf32"]) == 2  # the demo spec's device is the CPU
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "valid precisions on cpu: fp32, autocast, bf16" in err
    assert sweep.main([DEMO_SPEC, "--plan", "--precision", "fp16"]) == 2
    assert "valid choices: fp32, tf32, autocast, bf16" in capsys.readouterr().err
    assert sweep.main(["no-such-spec.yaml", "--precision", "bf16"]) == 2  # without --plan: before the spec is read
    assert "options of --plan" in capsys.readouterr().err
    assert sweep.main([DEMO_SPEC, "--plan", "--plan-steps", "0"]) == 2
    assert "positive integer" in capsys.readouterr().err


def test_a_sweep_of_another_notebook_gets_its_counts_and_no_estimate(results, reports, capsys):
    assert sweep.main([PLASTICITY_SPEC, "--plan"]) == 0
    out = capsys.readouterr().out
    total = next(line for line in out.splitlines() if line.startswith("total "))
    assert total.split() == ["total", "3", "0", "0", "0", "3"]
    assert "no estimate: estimates are for finetuning sweeps (05_finetune)" in out and "img/s" not in out
    assert plan.plan(sweep.expand(specs.load_spec(PLASTICITY_SPEC)))["estimate"] is None
    assert not results.exists() and not reports.exists()


@pytest.mark.parametrize(
    ("spec", "runs", "models", "optimizers"),
    [
        ("ablation_model_size.yaml", 144, {"vit_large_in21k", "vit_huge_in21k"}, {"sgd"}),
        ("ablation_adam.yaml", 288, {"vit_base_in21k"}, {"adamw"}),
    ],
)
def test_the_plan_of_each_of_the_authors_ablations_prints_its_runs_and_device_hours(
    spec, runs, models, optimizers, results, reports, monkeypatch, capsys
):
    # a GPU machine's plan, without one: its device named and its step timed at a fixed rate
    for name in ("_device_here", "device_name"):
        monkeypatch.setattr(plan, name, lambda device: "NVIDIA H100 80GB HBM3")
    fixed_rate(monkeypatch, 500.0)
    path = str(paths.PARAMETERS / "sweeps" / spec)
    assert sweep.main([path, "--plan"]) == 0
    out = capsys.readouterr().out
    total = next(line for line in out.splitlines() if line.startswith("total "))
    assert total.split() == ["total", str(runs), "0", "0", "0", str(runs)]
    configs_ = [config_from(run.parameters) for run in sweep.expand(specs.load_spec(path))]
    images = sum(config.steps * config.batch_size for config in configs_)
    hours = next(line for line in out.splitlines() if line.startswith("total:"))
    assert hours.startswith(f"total: {images / 500.0 / 3600:,.1f} device-hours"), hours
    assert {c.model for c in configs_} == models and {c.optimizer for c in configs_} == optimizers
    assert {c.component for c in configs_} == {"full", "ln1", "mha", "ln2", "fc1", "fc2"}
    assert not results.exists() and not reports.exists()
