"""Sweeps: grid expansion, skip-on-restart, failure isolation, executors."""

import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from paperlib.records import specs, storage
from paperlib.records.names import COMPONENTS
from paperlib.records.runs import config_values
from paperlib.sweeps import sweep


@pytest.fixture
def tiny_notebook(tmp_path, write_notebook):
    return write_notebook(
        tmp_path / "tiny.ipynb",
        "if fail:\n    raise ValueError('asked to fail')\nprint('twice', value * 2)",
        parameters="value = 1  # a number\nfail = False  # raise on purpose\nseed = 0\n"
        'dataset = "a"  # a name ("quoted")\nrate = 0.5\ntag = ""\nextra = 0',
        heading="# tiny",
    )


@pytest.fixture
def reports(tmp_path, monkeypatch, move_results):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    move_results("results")
    return tmp_path / "reports"


def test_expand_is_the_grid_product_in_written_order(tiny_notebook):
    spec = {
        "notebook": str(tiny_notebook),
        "parameters": {"fail": False},
        "grid": {"value": [1, 2], "tag": ["a/b", "c"]},
    }
    runs = sweep.expand(spec)
    assert [r.name for r in runs] == ["1/a/b", "1/c", "2/a/b", "2/c"]
    assert runs[2].parameters == {"fail": False, "value": 2, "tag": "a/b"}
    named = sweep.expand({**spec, "name": "v{value}-{tag}"})
    assert [r.name for r in named][:2] == ["v1-a/b", "v1-c"]
    with pytest.raises(ValueError, match="same name"):
        sweep.expand({**spec, "name": "v{value}"})


def test_spec_errors(tmp_path, tiny_notebook):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"notebook": str(tiny_notebook), "grids": {"value": [1]}}))
    with pytest.raises(ValueError, match="valid keys: grid, name, notebook, parameters, slurm"):
        specs.load_spec(bad)
    bad.write_text(yaml.safe_dump({"notebook": str(tiny_notebook), "grid": {"value": 1}}))
    with pytest.raises(ValueError, match="non-empty list"):
        specs.load_spec(bad)
    with pytest.raises(ValueError, match="valid executors: local, gpus, slurm, submitit-local"):
        sweep.run_sweep({"notebook": str(tiny_notebook)}, executor="threads")


def test_failures_are_isolated_and_finished_runs_skipped(tiny_notebook, reports):
    spec = {"notebook": str(tiny_notebook), "grid": {"fail": [False, True], "value": [3, 4]}}
    runs = sweep.run_sweep(spec)
    status = {r.name: r.status for r in runs}
    assert status == {"False/3": "done", "False/4": "done", "True/3": "failed", "True/4": "failed"}
    folder = reports / "tiny"
    assert "asked to fail" in (folder / "True" / "3.error.txt").read_text()
    assert "twice 8" in (folder / "False" / "4.ipynb").read_text()
    marker = json.loads((folder / "False" / "3.done.json").read_text())
    assert marker["parameters"] == {"fail": False, "value": 3}
    assert not list(folder.rglob("*.html"))  # the executed notebooks only, unless asked (--html)
    index = (reports / "index.html").read_text()
    assert 'href="tiny/False/3.ipynb"' in index and 'href="tiny/True/3.ipynb"' not in index

    # restart: finished runs are skipped, failed ones are tried again
    stamp = (folder / "False" / "3.done.json").stat().st_mtime_ns
    again = {r.name: r.status for r in sweep.run_sweep(spec)}
    assert again == {"False/3": "skipped", "False/4": "skipped", "True/3": "failed", "True/4": "failed"}
    assert (folder / "False" / "3.done.json").stat().st_mtime_ns == stamp

    # an interrupted run (outputs but no marker) counts as unfinished
    (folder / "False" / "4.done.json").unlink()
    assert {r.name: r.status for r in sweep.run_sweep(spec)}["False/4"] == "done"

    # a fixed parameter edited since (not in the runs' names): the runs are not finished any more
    edited = {**spec, "parameters": {"extra": 5}}
    assert not any(run.finished for run in sweep.expand(edited)) and all(run.finished for run in sweep.expand(spec)[:2])
    again = {r.name: r.status for r in sweep.run_sweep(edited)}
    assert again["False/3"] == again["False/4"] == "done"
    assert json.loads((folder / "False" / "3.done.json").read_text())["parameters"] == {
        "extra": 5,
        "fail": False,
        "value": 3,
    }


def test_a_run_on_edited_custom_images_or_a_resaved_model_is_not_finished(
    tiny_notebook, reports, tmp_path, monkeypatch
):
    from paperlib.data import fixtures
    from paperlib.vit import models

    monkeypatch.setenv("VIT_PLASTICITY_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("VIT_PLASTICITY_MODELS", raising=False)
    fixtures.write_image_folder(tmp_path / "data" / "custom" / "shots", ["cat", "dog"], per_class=2)
    models.save_model(models.create_model("demo"), "custom/vit")
    spec = {
        "notebook": str(tiny_notebook),
        "parameters": {"tag": "custom/vit"},
        "grid": {"dataset": ["custom/shots", "digits"]},
    }
    assert {r.name: r.status for r in sweep.run_sweep(spec)} == {"custom/shots": "done", "digits": "done"}
    marker = json.loads((reports / "tiny" / "custom" / "shots.done.json").read_text())
    assert set(marker["fingerprints"]) == {"dataset:custom/shots", "model:custom/vit"}
    assert {r.name: r.status for r in sweep.run_sweep(spec)} == {"custom/shots": "skipped", "digits": "skipped"}

    fixtures.write_image_folder(tmp_path / "data" / "custom" / "shots", ["eel"], per_class=2)  # a class more
    assert [run.finished for run in sweep.expand(spec)] == [False, True]
    assert {r.name: r.status for r in sweep.run_sweep(spec)} == {"custom/shots": "done", "digits": "skipped"}
    assert {r.name: r.status for r in sweep.run_sweep(spec)} == {"custom/shots": "skipped", "digits": "skipped"}

    # other weights, same name
    models.save_model(models.create_model("demo", num_classes=3), "custom/vit", overwrite=True)
    assert [run.finished for run in sweep.expand(spec)] == [False, False]
    # markers written before fingerprints were recorded: a run naming custom inputs runs again once
    for run in sweep.run_sweep(spec):
        marker = json.loads(run.marker.read_text())
        assert run.status == "done" and marker.pop("fingerprints") == run.fingerprints
        storage.write_json(run.marker, marker)
    assert [run.finished for run in sweep.expand(spec)] == [False, False]  # tag names the custom model in both
    assert sweep.parameter_fingerprints({"dataset": "custom/absent", "tag": "custom/", "value": 3}) == {}


def test_a_run_that_makes_its_own_custom_inputs_records_them(tmp_path, reports, monkeypatch, write_notebook):
    # notebook 08's example writes its dataset the first time: the marker must describe what is there after
    monkeypatch.setenv("VIT_PLASTICITY_DATA", str(tmp_path / "data"))
    write_notebook(
        tmp_path / "maker.ipynb",
        "from paperlib.data import fixtures\nfrom paperlib.records import paths\n"
        "if not (paths.data_dir() / dataset).is_dir():\n"
        "    fixtures.write_image_folder(paths.data_dir() / dataset, ['a', 'b'], per_class=1)",
        parameters='dataset = "custom/made"',
    )
    spec = {"notebook": str(tmp_path / "maker.ipynb"), "grid": {"dataset": ["custom/made"]}}
    assert [r.status for r in sweep.run_sweep(spec)] == ["done"]
    assert "dataset:custom/made" in json.loads(sweep.expand(spec)[0].marker.read_text())["fingerprints"]
    assert [r.status for r in sweep.run_sweep(spec)] == ["skipped"]


def test_restricting_a_spec_keeps_the_runs_with_the_given_values(tiny_notebook):
    one = {"notebook": str(tiny_notebook), "parameters": {"seed": 0}, "grid": {"dataset": ["a", "b"], "value": [1, 2]}}
    assert [r.name for r in sweep.expand(specs.restrict(one, dataset=["b"]))] == ["b/1", "b/2"]
    # a list of grids (finetune_paper.yaml: one per group of datasets): each is restricted, empty ones go
    groups = {**one, "grid": [{"dataset": ["a"], "value": [1]}, {"dataset": ["b", "c"], "value": [2, 3]}]}
    assert [r.name for r in sweep.expand(specs.restrict(groups, dataset=["c"], seed=[0]))] == ["c/2", "c/3"]
    with pytest.raises(ValueError, match="no run with dataset in \\['z'\\]; its values: dataset: a, b, c"):
        specs.restrict(groups, dataset=["z"])
    with pytest.raises(ValueError, match="seed: 0"):  # a fixed parameter counts as one value
        specs.restrict(groups, seed=[1])
    paper = specs.load_spec("parameters/sweeps/finetune_paper.yaml")
    assert {r.parameters["dataset"] for r in sweep.expand(specs.restrict(paper, dataset=["pets"], seed=[0]))} == {
        "pets"
    }


def test_gpu_executor_needs_gpus(tiny_notebook, reports, monkeypatch):
    monkeypatch.setattr(sweep, "_visible_gpus", lambda: [])
    with pytest.raises(ValueError, match="no GPU"):
        sweep.run_sweep({"notebook": str(tiny_notebook), "grid": {"value": [1]}}, executor="gpus")


def test_gpu_executor_pins_one_worker_process_per_gpu(tmp_path, reports, write_notebook, monkeypatch):
    monkeypatch.setattr(sweep, "_visible_gpus", lambda: [0, 3, 5])
    # ids need no real GPU (this machine's are faked): each worker process exports its id as
    # CUDA_VISIBLE_DEVICES, and the papermill kernel it starts inherits it
    notebook = write_notebook(
        tmp_path / "pinned.ipynb",
        "import os, time\ntime.sleep(1)\n"
        "print('pinned', os.environ.get('CUDA_VISIBLE_DEVICES'), 'worker', os.getppid(),"
        " 'sharing', os.environ.get('VIT_PLASTICITY_WORKERS'))",
        parameters="value = 1  # a number",
    )
    runs = sweep.run_sweep({"notebook": str(notebook), "grid": {"value": [1, 2, 3, 4]}}, executor="gpus", gpus=[3, 5])
    assert [r.status for r in runs] == ["done"] * 4, [r.error for r in runs]
    seen = set()
    for value in (1, 2, 3, 4):
        text = json.loads((reports / "pinned" / f"{value}.ipynb").read_text())["cells"][-1]["outputs"][0]["text"]
        _, gpu, _, worker, _, sharing = (text if isinstance(text, str) else "".join(text)).split()
        seen.add((gpu, worker))
        assert sharing == "2"  # two workers on this machine: each takes half its cores (threads.budget)
    gpus = {gpu for gpu, _ in seen}
    assert gpus <= {"3", "5"} and len(gpus) == 2  # both GPUs served runs
    # one process per GPU, each always on its own GPU
    assert len({worker for _, worker in seen}) == 2 and len(seen) == 2


def test_demo_plasticity_sweep_through_submitit(reports, tmp_path):
    spec = specs.load_spec(sweep.paths.PARAMETERS / "sweeps" / "plasticity_demo.yaml")
    spec["grid"]["dataset"] = ["digits_c/snow"]
    spec["parameters"]["n_pairs"] = 16
    runs = sweep.run_sweep(spec, executor="submitit-local", html=True)
    assert [(r.name, r.status) for r in runs] == [("demo/digits_c/snow", "done")], runs[0].error
    for report in ("snow.ipynb", "snow.html", "snow.nocode.html"):  # asked for its HTML reports too
        assert (reports / "02_plasticity" / "demo" / "digits_c" / report).is_file()
    assert (tmp_path / "results" / "plasticity" / "demo" / "digits_c" / "snow" / "metadata.json").is_file()


def test_paper_spec_covers_both_models_and_the_11_benchmarks():
    from paperlib.data import datasets

    spec = specs.load_spec(sweep.paths.PARAMETERS / "sweeps" / "plasticity_paper.yaml")
    assert spec["grid"]["model"] == ["vit_base_in21k", "vit_huge_in21k"]
    assert sorted(spec["grid"]["dataset"]) == sorted(datasets.PAPER_DATASETS)
    assert spec["parameters"]["n_pairs"] == 12800 and spec["parameters"]["reference"] == "imagenet"
    assert len(sweep.expand(spec)) == 22


def test_finetune_specs_follow_table_5():
    from paperlib.data import datasets

    spec = specs.load_spec(sweep.paths.PARAMETERS / "sweeps" / "finetune_paper.yaml")
    runs = sweep.expand(spec)
    assert len(runs) == 11 * 7 * 4 * 3
    steps = {r.parameters["dataset"]: r.parameters["steps"] for r in runs}
    assert sorted(steps) == sorted(datasets.PAPER_DATASETS)
    assert (
        steps["cifar10"] == 10000
        and steps["domainnet/sketch"] == 20000
        and steps["flowers102"] == 5000
        and steps["pets"] == 4000
    )
    lrs = {r.parameters["lr"] for r in runs if r.parameters["dataset"] == "domainnet/clipart"}
    assert lrs == {0.003, 0.01, 0.03, 0.06}
    assert {r.parameters["seed"] for r in runs} == {0, 42, 3407}
    assert all(r.parameters["batch_size"] == 512 for r in runs)
    assert len(sweep.expand(specs.load_spec(sweep.paths.PARAMETERS / "sweeps" / "finetune_demo.yaml"))) == 42


# The authors' validation periods (``eval_period`` of the configs their finetuning.sh names; docs/fidelity.md)
AUTHORS_EVAL_PERIOD = {
    "cifar10": 500,
    "cifar100": 500,
    "cifar10c": 350,
    "domainnet": 500,
    "flowers102": 250,
    "pets": 200,
}


def test_paper_runs_validate_as_often_as_the_authors_runs():
    from paperlib.data import datasets

    files = sorted((sweep.paths.PARAMETERS / "finetune").glob("*.yaml"))
    found = {}
    for path in files:
        parameters = yaml.safe_load(path.read_text())
        found[parameters["dataset"]] = parameters["eval_every"]
        assert parameters["eval_every"] == AUTHORS_EVAL_PERIOD[parameters["dataset"].split("/")[0]], path.name
    assert sorted(found) == sorted(datasets.PAPER_DATASETS)
    for name in ("finetune_paper", "lora_paper", "precision_paper"):  # the sweeps run the same protocol
        for run in sweep.expand(specs.load_spec(sweep.paths.PARAMETERS / "sweeps" / f"{name}.yaml")):
            assert run.parameters["eval_every"] == found[run.parameters["dataset"]], (name, run.parameters)


def test_finetune_parameter_files_set_notebook_parameters_only():
    nb = nbformat.read(sweep.paths.NOTEBOOKS / "05_finetune.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    names = {line.split("=")[0].strip() for line in source.splitlines() if "=" in line}
    files = sorted((sweep.paths.PARAMETERS / "finetune").glob("*.yaml"))
    assert len(files) == 11
    for path in files:
        assert set(yaml.safe_load(path.read_text())) <= names, path.name


def test_spec_parameters_must_be_the_notebooks_and_numbers_are_read_as_numbers(tiny_notebook):
    assert specs.notebook_parameters(tiny_notebook) == {
        "value": 1,
        "fail": False,
        "seed": 0,
        "dataset": "a",
        "rate": 0.5,
        "tag": "",
        "extra": 0,
    }
    for text in ("not json", '{"cells": 1}', "[]"):  # read as JSON: what is no notebook is named so
        (tiny_notebook.parent / "broken.ipynb").write_text(text)
        with pytest.raises(ValueError, match="broken.ipynb is not a notebook"):
            specs.notebook_parameters(tiny_notebook.parent / "broken.ipynb")
    with pytest.raises(
        ValueError,
        match="tiny.ipynb has no parameter learning_rate, vlaue; "
        "its parameters: value, fail, seed, dataset, rate, tag, extra",
    ):
        sweep.expand({"notebook": str(tiny_notebook), "parameters": {"learning_rate": 0.1}, "grid": {"vlaue": [1]}})
    runs = sweep.expand(
        {
            "notebook": str(tiny_notebook),
            "parameters": {"rate": "1e-2"},
            "grid": {"value": ["3", 4], "dataset": ["1e-2"]},
        }
    )
    assert [(r.parameters["rate"], r.parameters["value"], r.parameters["dataset"]) for r in runs] == [
        (0.01, 3, "1e-2"),
        (0.01, 4, "1e-2"),
    ]
    with pytest.raises(ValueError, match="value must be int, got 'three'"):
        sweep.expand({"notebook": str(tiny_notebook), "grid": {"value": ["three"]}})
    # the project's specs name real parameters
    for spec in ("finetune_demo", "finetune_paper", "plasticity_demo", "plasticity_paper"):
        assert sweep.expand(specs.load_spec(f"parameters/sweeps/{spec}.yaml"))


def test_a_finetuning_specs_precision_and_step_options_reach_the_run_as_they_are():
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"compile": "blocks", "speed": "none"},
        "grid": {"precision": ["fp32", "autocast"]},
    }
    cells = specs.cells(spec)
    assert [parameters for _, _, parameters in cells] == [
        {"compile": "blocks", "speed": "none", "precision": "fp32"},
        {"compile": "blocks", "speed": "none", "precision": "autocast"},
    ]
    made = [config_values(parameters) for _, _, parameters in cells]
    assert [(c["precision"], c["compile"], c["fused"]) for c in made] == [
        ("fp32", "blocks", "none"),
        ("autocast", "blocks", "none"),
    ]
    with pytest.raises(ValueError, match="05_finetune.ipynb has no parameter precison"):
        specs.cells({**spec, "grid": {"precison": ["fp32"]}})


def write_spec(path, notebook, grid, **parameters):
    """A sweep spec file of ``notebook`` (under notebooks/ or a path) with ``grid`` and fixed ``parameters``."""
    path.write_text(yaml.safe_dump({"notebook": str(notebook), "parameters": parameters, "grid": grid}))
    return str(path)


def one_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


def test_every_cell_is_checked_before_the_first_run_and_plan_and_dry_run_agree(tmp_path, reports, capsys):
    plasticity = write_spec(tmp_path / "p.yaml", "notebooks/02_plasticity.ipynb", {"dataset": ["digits", "cifar11"]})
    finetune = write_spec(
        tmp_path / "f.yaml", "notebooks/05_finetune.ipynb", {"component": ["mha", "fc3"]}, steps=4, warmup=0
    )
    for spec, bad, valid in (
        (plasticity, "run cifar11: unknown dataset 'cifar11'", "valid datasets: digits"),
        (finetune, "run fc3: unknown finetuning configuration 'fc3'", "valid configurations: mha"),
    ):
        for options in ([], ["--dry-run"], ["--plan"]):
            assert sweep.main([spec, *options]) == 2, options
            line = one_line(capsys.readouterr().err)
            assert bad in line and valid in line, (options, line)
    assert not reports.exists() and not (tmp_path / "results").exists()  # digits was not run first
    # a precision the run's device lacks, a device this machine lacks (the plan may be made elsewhere)
    tf32 = write_spec(tmp_path / "t.yaml", "notebooks/05_finetune.ipynb", {"precision": ["fp32", "tf32"]}, device="cpu")
    assert sweep.main([tf32, "--dry-run"]) == 2 and "valid precisions on cpu: fp32" in capsys.readouterr().err
    if not sweep.torch.cuda.is_available():
        cuda = write_spec(tmp_path / "c.yaml", "notebooks/02_plasticity.ipynb", {"dataset": ["digits"]}, device="cuda")
        assert sweep.main([cuda]) == 2
        assert "device 'cuda' is not on this machine; devices here: cpu" in one_line(capsys.readouterr().err)
        assert sweep.main([cuda, "--dry-run"]) == 0 and not reports.exists()


def test_a_missing_custom_dataset_is_refused_in_one_line_before_the_first_run(tmp_path, reports, home, capsys):
    from paperlib.data import fixtures

    finetune = "notebooks/05_finetune.ipynb"
    absent = write_spec(tmp_path / "f.yaml", finetune, {"dataset": ["digits", "custom/absent"]})
    reference = write_spec(
        tmp_path / "p.yaml", "notebooks/02_plasticity.ipynb", {"dataset": ["digits"]}, reference="custom/absent"
    )
    fixtures.write_image_folder(tmp_path / "data" / "custom" / "one", ["cat"], per_class=2)
    single = write_spec(tmp_path / "s.yaml", finetune, {"dataset": ["digits", "custom/one"]})
    for spec, start, detail in (
        (absent, "run custom/absent: custom/absent not found: expected ", "Custom datasets found under "),
        (reference, "run digits: custom/absent not found: expected ", "Custom datasets found under "),
        (single, "run custom/one: custom/one: ", "has 1 class folder(s) (cat)"),
    ):
        assert sweep.main([spec]) == 2
        line = one_line(capsys.readouterr().err)
        assert start in line and detail in line, line
    assert not reports.exists() and not (tmp_path / "results").exists()  # digits was not run first


def test_gpus_and_an_empty_grid_are_refused_in_one_line(tmp_path, tiny_notebook, reports, monkeypatch, capsys):
    spec = write_spec(tmp_path / "s.yaml", tiny_notebook, {"value": [1]})
    assert sweep.main([spec, "--gpus", "0"]) == 2
    assert "--gpus is an option of --executor gpus, not of --executor local" in one_line(capsys.readouterr().err)
    monkeypatch.setattr(sweep, "_visible_gpus", lambda: [])
    assert sweep.main([spec, "--executor", "gpus", "--gpus", "0"]) == 2
    assert "executor 'gpus' found no GPU here" in one_line(capsys.readouterr().err)
    monkeypatch.setattr(sweep, "_visible_gpus", lambda: [0, 1])
    for gpus, message in (("2", "no GPU 2 on this machine; GPUs here: 0, 1"), ("0,x", "GPU ids joined by commas")):
        assert sweep.main([spec, "--executor", "gpus", "--gpus", gpus]) == 2
        assert message in one_line(capsys.readouterr().err)
    on_two = write_spec(tmp_path / "g.yaml", "notebooks/02_plasticity.ipynb", {"device": ["cuda:1"]})
    assert sweep.main([on_two, "--executor", "gpus"]) == 2  # each worker sees one GPU
    assert "device 'cuda:1': under --executor gpus a run sees one GPU" in one_line(capsys.readouterr().err)
    for grid in ({}, []):
        (tmp_path / "empty.yaml").write_text(yaml.safe_dump({"notebook": str(tiny_notebook), "grid": grid}))
        assert sweep.main([str(tmp_path / "empty.yaml")]) == 2
        assert "has an empty grid" in one_line(capsys.readouterr().err)
    (tmp_path / "none.yaml").write_text(yaml.safe_dump({"notebook": str(tiny_notebook)}))
    assert sweep.main([str(tmp_path / "none.yaml"), "--dry-run"]) == 2
    assert not reports.exists()


def test_slurm_is_refused_in_one_line_where_sbatch_is_not_and_asked_for_by_name_where_it_is(
    tmp_path, tiny_notebook, reports, monkeypatch, capsys
):
    spec = write_spec(tmp_path / "s.yaml", tiny_notebook, {"value": [1, 2]})
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch: submitit would run the jobs here, all at once
    assert sweep.main([spec, "--executor", "slurm"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "sbatch is not on PATH here" in line and "valid executors here: local" in line and "submitit-local" in line
    assert not reports.exists() and not (tmp_path / "results").exists()

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sbatch").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "sbatch").chmod(0o755)
    monkeypatch.setattr(sweep.submitit, "AutoExecutor", Submitit)
    Submitit.asked = []
    assert [run.status for run in sweep.run_sweep(specs.load_spec(spec), executor="slurm")] == ["done", "done"]
    # SLURM by name, never submitit's choice of a local fallback; its jobs have their own cores (no share)
    assert Submitit.asked == [{"cluster": "slurm"}, {"workers": None}]


class Submitit:
    """Stands for submitit's executors: records how it was made and the workers its jobs are told of; runs them here."""

    asked: list = []

    def __init__(self, folder, **options):
        self.asked.append(options)

    def update_parameters(self, **parameters):
        pass

    def map_array(self, task, todo):
        self.asked.append({"workers": sweep.os.environ.get(sweep.threads.WORKERS)})
        return [type("Job", (), {"result": lambda self, run=run: task(run)})() for run in todo]


def test_submitit_local_says_how_many_runs_share_the_cores(tiny_notebook, reports, monkeypatch, capsys):
    monkeypatch.setattr(sweep.threads, "cores", lambda: 8)
    monkeypatch.setattr(sweep.submitit, "LocalExecutor", Submitit)
    Submitit.asked = []
    spec = {"notebook": str(tiny_notebook), "grid": {"value": [1, 2, 3, 4]}}
    assert [run.status for run in sweep.run_sweep(spec, executor="submitit-local")] == ["done"] * 4
    assert "submitit-local: 4 runs at once on this machine, each with 2 of its 8 CPU cores" in capsys.readouterr().out
    assert Submitit.asked == [{}, {"workers": "4"}]


def test_runs_made_outside_a_sweep_are_finished_for_its_plan_its_dry_run_and_itself(
    tmp_path, reports, monkeypatch, capsys
):
    from conftest import SMALL, found

    from paperlib.analysis import plasticity_table
    from paperlib.train import finetune

    finetuning = write_spec(tmp_path / "f.yaml", "notebooks/05_finetune.ipynb", {"component": ["ln1", "mha"]}, **SMALL)
    datasets = {"dataset": ["digits", "digits_c/snow"]}
    measuring = write_spec(tmp_path / "p.yaml", "notebooks/02_plasticity.ipynb", datasets)
    # the first run of each, made as notebook 05 or `python -m paperlib finetune` make it (a P(f) result: 02)
    made = [sweep.expand(specs.load_spec(spec))[0] for spec in (finetuning, measuring)]
    finetune.run(sweep.config_from(made[0].parameters))
    rates = pd.DataFrame([{"block": 0, "depth": 0, "component": c, "pair": 0, "rate": 1.0} for c in COMPONENTS])
    plasticity_table.save(rates, sweep.measurement(made[1].parameters, made[1].notebook), found(rates))
    executed = []  # the notebooks a sweep executes: none is, here (no kernel), and none writes results

    def execute(notebook, output, parameters):
        executed.append(output.relative_to(reports).as_posix())
        return output

    monkeypatch.setattr(sweep.execute, "execute", execute)
    for spec, first, second in ((finetuning, "ln1", "mha"), (measuring, "digits", "digits_c/snow")):
        assert sweep.main([spec, "--plan", "--plan-steps", "1"]) == 0
        total = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("total")).split()
        assert total[1:3] == ["2", "1"], total  # runs, finished
        assert sweep.main([spec, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "\n1 finished, 1 to run; 1 finished without a report (--reports writes them)" in out, out
        notebook = Path(specs.load_spec(spec)["notebook"]).stem
        assert sweep.main([spec]) == 0 and executed == [f"{notebook}/{second}.ipynb"]
        assert "1 done, 0 finished by another process, 1 skipped (finished before)" in capsys.readouterr().out
        # a report's marker is not a result: the run without results is executed again; --reports: the other too
        assert sweep.main([spec, "--reports"]) == 0
        assert executed[1:] == [f"{notebook}/{first}.ipynb", f"{notebook}/{second}.ipynb"]
        assert sweep.main([spec, "--dry-run"]) == 0 and "\n1 finished, 1 to run\n" in capsys.readouterr().out
        executed.clear()

    # a measurement of custom images: its record keeps no fingerprint of them; its report's marker does, and must agree
    from paperlib.data import fixtures

    monkeypatch.setenv("VIT_PLASTICITY_DATA", str(tmp_path / "data"))
    fixtures.write_image_folder(tmp_path / "data" / "custom" / "shots", ["cat", "dog"], per_class=2)
    custom = {"notebook": "notebooks/02_plasticity.ipynb", "grid": {"dataset": ["custom/shots"]}}
    custom_run = sweep.expand(custom)[0]
    plasticity_table.save(rates, sweep.measurement(custom_run.parameters, custom_run.notebook), found(rates))
    assert not sweep.expand(custom)[0].finished  # made outside a sweep: what it was made of is not known
    assert [run.status for run in sweep.run_sweep(custom)] == ["done"] and sweep.expand(custom)[0].finished
    fixtures.write_image_folder(tmp_path / "data" / "custom" / "shots", ["eel"], per_class=2)  # a class more
    assert not sweep.expand(custom)[0].finished


def test_the_summary_gives_a_failed_runs_last_error_line(tmp_path, tiny_notebook, reports, capsys):
    spec = write_spec(tmp_path / "s.yaml", tiny_notebook, {"fail": [False, True]})
    assert sweep.main([spec]) == 1
    out = capsys.readouterr().out
    failed = next(line for line in out.splitlines() if line.startswith("failed"))
    assert failed.split()[1] == "True" and failed.endswith("ValueError: asked to fail"), out
    assert "1 done, 0 finished by another process, 0 skipped (finished before), 1 failed" in out
    assert (reports / "tiny" / "True.error.txt").read_text().startswith("PapermillExecutionError")


def test_plan_refuses_another_precision_for_a_spec_with_a_precision_axis(reports, capsys):
    spec = "parameters/sweeps/precision_demo.yaml"
    assert sweep.main([spec, "--plan", "--precision", "bf16"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "this spec has a precision axis (autocast, fp32)" in line and "without --precision" in line


def test_a_plasticity_runs_measurement_takes_notebook_02s_defaults_for_what_its_spec_leaves_out(tmp_path):
    spec = tmp_path / "plasticity.yaml"
    parameters = "parameters:\n  model: vit_base_in21k\n  n_pairs: 16\ngrid:\n  dataset: [cifar10]\n"
    spec.write_text("notebook: notebooks/02_plasticity.ipynb\n" + parameters)
    run = sweep.expand(sweep.specs.load_spec(spec))[0]
    defaults = sweep.specs.notebook_parameters(run.notebook)
    made = sweep.measurement(run.parameters, run.notebook)
    # the notebook's reference, not Measurement's "" (each dataset's own): the folder the notebook writes
    own = sweep.plasticity.Measurement(model="vit_base_in21k", dataset="cifar10")
    assert made.reference == defaults["reference"] != own.reference
    assert (made.model, made.dataset, made.n_pairs) == ("vit_base_in21k", "cifar10", 16)
