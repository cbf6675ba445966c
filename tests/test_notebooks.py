"""Notebooks stay thin, parameterised and in sync with their jupytext twins."""

import ast
import json

import jupytext
import nbformat
import papermill
import pytest

from paperlib.records import paths
from paperlib.reports import execute

NOTEBOOKS = sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


def _code(notebook):
    return [c.source.strip() for c in notebook.cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_paired_script_in_sync(path):
    script = path.with_suffix(".py")
    assert script.is_file(), f"{path.name} has no jupytext twin {script.name}: run `make sync`"
    ipynb = jupytext.read(path)
    text = jupytext.read(script)
    assert _code(ipynb) == _code(text), f"{path.name} and {script.name} differ: run `make sync`"
    markdown = lambda nb: [c.source.strip() for c in nb.cells if c.cell_type == "markdown"]  # noqa: E731
    assert markdown(ipynb) == markdown(text)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exactly_one_parameters_cell_with_flat_literals(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged 'parameters', found {len(tagged)}"
    for line in tagged[0].source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            assert "=" in line and "#" in line, f"parameter without a comment in {path.name}: {line!r}"
    # papermill reads every one (its --help-notebook; a sweep's runs): it skips a line with an "=" in its comment
    assigned = {node.targets[0].id for node in ast.parse(tagged[0].source).body if isinstance(node, ast.Assign)}
    assert set(papermill.inspect_notebook(str(path))) == assigned


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_executed_without_errors(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), f"{path.name} is not fully executed: run `make notebooks`"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} was committed with errors"
    assert nb.metadata.get("kernelspec", {}).get("name") == execute.KERNEL
    assert "papermill" not in json.dumps(nb.metadata), "papermill outputs belong in reports/, not notebooks/"


def test_unknown_notebook_is_a_clear_error():
    with pytest.raises(ValueError, match="valid notebooks: 00_components"):
        paths.notebook_paths(["99_nothing"])


def test_parameter_files_only_set_existing_parameters():
    import yaml

    for path in sorted(paths.PARAMETERS.glob("[0-9][0-9]_*.yaml")):
        notebook = next(paths.NOTEBOOKS.glob(path.name[:3] + "*.ipynb"))
        nb = nbformat.read(notebook, as_version=4)
        source = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        names = {line.split("=")[0].strip() for line in source.splitlines() if "=" in line and not line.startswith("#")}
        unknown = set(yaml.safe_load(path.read_text())) - names
        assert not unknown, f"{path.name} sets {unknown}, which {notebook.name} does not have"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_paths_of_this_machine_in_committed_outputs(path):
    text = path.read_text()
    assert str(paths.ROOT) not in text and "site-packages" not in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_cell_after_the_parameters_checks_them(path):
    code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    first = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", [])) + 1
    calls = [node.value for node in ast.parse(code[first].source).body if isinstance(node, ast.Expr)]
    assert "notebook.check_parameters()" in [ast.unparse(call) for call in calls], f"{path.name} checks no -p"


def test_papermill_with_a_parameter_the_notebook_lacks_stops_naming_it(tmp_path):
    # the check above in action, in the notebook a sweep runs most (each notebook's costs a kernel: 10-14 s)
    path = paths.NOTEBOOKS / "05_finetune.ipynb"
    with pytest.raises(papermill.PapermillExecutionError, match=r"unknown parameter\(s\) lrr; this notebook's"):
        execute.execute(path, tmp_path / "out.ipynb", parameters={"lrr": 0.1})
    assert not (tmp_path / "out.ipynb").exists()
