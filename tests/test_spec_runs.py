"""One call gives a notebook the runs of sweep specs: computed where missing when asked, read, checked."""

import pytest
import yaml

from paperlib.sweeps.spec_runs import spec_runs

SPEC = {
    "notebook": "notebooks/05_finetune.ipynb",
    "parameters": {"steps": 8, "warmup": 2, "eval_every": 4, "batch_size": 16, "lr": 0.05},
    "grid": {"component": ["ln1", "ln2"]},
}


def test_a_specs_runs_are_run_only_where_asked_then_read_and_checked(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    with pytest.raises(ValueError, match=f"no run of {path}"):
        spec_runs(str(path))
    runs, missing = spec_runs(str(path), required=False)
    assert runs.empty and missing["component"].tolist() == ["ln1", "ln2"]

    runs, missing = spec_runs(str(path), "", compute_missing=True, only={"component": ["ln2"]})  # "": no spec
    assert capsys.readouterr().out.count(": finished in") == 1
    assert runs[["component", "status"]].values.tolist() == [["ln2", "finished"]]
    assert missing[["component", "reason"]].values.tolist() == [["ln1", "no run"]]

    assert spec_runs(SPEC, model="")[0]["model"].tolist() == ["demo"]  # the runs' one model
    with pytest.raises(ValueError, match="runs of: demo"):
        spec_runs(SPEC, model="vit_base_in21k")
