"""The README's commands: every notebook option, file and module it names exists, and the paper-scale
commands that can run without the paper's data and GPUs do (notebook 07 and ``stats`` on a part of the
paper's grid, written as a sweep writes it)."""

import ast
import functools
import importlib.util
import re
import shlex
import subprocess
import sys

import nbformat
import pytest
import yaml

from paperlib.__main__ import COMMANDS
from paperlib.__main__ import main as paperlib_main
from paperlib.analysis import summary
from paperlib.measure import plasticity
from paperlib.records import paths
from paperlib.reports import execute
from paperlib.sweeps import sweep
from paperlib.train import demo, finetune

README = (paths.ROOT / "README.md").read_text()


def paper_map() -> dict[str, list[str]]:
    """Each notebook of the README's paper map: the commands (code spans) of its paper-scale options."""
    rows = {}
    for line in README.splitlines():
        if found := re.match(r"\| `(\d\d_\w+)` \|", line):
            rows[found[1]] = re.findall(r"`([^`]+)`", line.rsplit("|", 2)[-2])
    return rows


def declared(notebook: str) -> set[str]:
    """The names the notebook's ``parameters`` cell assigns."""
    cells = nbformat.read(paths.ROOT / "notebooks" / f"{notebook}.ipynb", as_version=4).cells
    cell = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    return {t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign) for t in node.targets}


def options(command: str) -> dict:
    """``-p name value`` of a papermill command as papermill reads them (YAML-typed values)."""
    words = shlex.split(command)
    return {words[i + 1]: yaml.safe_load(words[i + 2]) for i, word in enumerate(words) if word == "-p"}


def test_the_paper_map_lists_every_notebook_and_names_their_parameters_and_files():
    rows = paper_map()
    assert sorted(rows) == sorted(path.stem for path in paths.ROOT.glob("notebooks/[0-9][0-9]_*.ipynb"))
    checked = 0
    for notebook, commands in rows.items():
        for command in commands:
            if command.startswith(("-p", "-f")):
                assert set(options(command)) <= declared(notebook), (notebook, command)
                checked += 1
    assert checked >= 8
    with pytest.raises(AssertionError):  # the check can fail
        assert set(options("-p not_a_parameter 1")) <= declared("07_finetune_results")


def test_every_file_and_module_the_readme_names_exists():
    files = set(
        re.findall(
            r"(?<![\w/])((?:parameters|notebooks|paperlib|docs|benchmarks)/[\w./-]+\.(?:yaml|py|md|ipynb|csv))", README
        )
    )
    assert len(files) > 10 and not [f for f in files if not (paths.ROOT / f).is_file()]
    modules = set(re.findall(r"python -m (benchmarks[\w.]*)", README))
    assert not [m for m in modules if importlib.util.find_spec(m) is None]


def readme_commands() -> list[list[str]]:
    """Every ``python -m paperlib ...`` the README writes, as its arguments: an optional ``[...]`` part written out
    (its first choice of ``a|b``), ``SPEC`` the demo finetuning spec."""
    commands = []
    for text in re.findall(r"python -m paperlib ([^`\n]+)", README):
        text = re.sub(r"\[([^\]]*)\]", lambda part: part[1].split("|")[0], text)
        commands.append(shlex.split(text.replace("SPEC", "parameters/sweeps/finetune_demo.yaml")))
    return commands


class Ran(Exception):
    """What a command's work raises here, once its command line is read and checked: the command runs as written."""


def test_python_m_paperlib_lists_its_commands_and_refuses_an_unknown_one():
    done = subprocess.run([sys.executable, "-m", "paperlib", "--help"], capture_output=True, text=True, check=True)
    assert [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")] == list(COMMANDS)
    wrong = subprocess.run([sys.executable, "-m", "paperlib", "stat"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown command 'stat'; valid commands: finetune, plasticity" in wrong.stderr


def test_every_command_in_the_readme_runs_as_written(monkeypatch, capsys):
    # each is read by its own command line up to the work it starts, which raises Ran here (no training, no data);
    # a command refused by its command line (an unknown option, a bad value) fails here
    for module, name in (
        (finetune, "run"),
        (plasticity, "run"),
        (sweep, "run_sweep"),
        (demo, "pretrain"),
        (demo.pool, "demo_runs"),
    ):

        @functools.wraps(getattr(module, name))  # its signature stays: plasticity's options are run's
        def ran(*args, **kwargs):
            raise Ran

        monkeypatch.setattr(module, name, ran)
    monkeypatch.setattr(execute, "run_demo", ran)
    commands = readme_commands()
    named = {command[0] for command in commands if not command[0].startswith("-")}  # `python -m paperlib --help` too
    assert named == set(COMMANDS) - {"report"}  # the README's `make demo` is report's
    for command in commands + [["report", "demo"]]:
        try:
            code = paperlib_main(command)
        except Ran:
            continue
        said = capsys.readouterr()
        if code == 0:  # it ran whole: a sweep's --plan
            continue
        # stats and precision read results: none here, and they say so in one line
        assert command[0] in ("stats", "precision") and code == 2, (command, code, said.err[-2000:])
        assert said.err.count("\n") == 1 and "no run of" in said.err, said.err


def test_the_grid_benchmark_writes_the_p_of_f_of_the_grids_model_on_each_of_its_datasets():
    from benchmarks.grid import LEVELS, build_plasticity
    from paperlib.analysis import plasticity_table

    assert build_plasticity(paths.results_dir(), pairs=8) == 11 and build_plasticity(paths.results_dir(), pairs=8) == 0
    collected = plasticity_table.collect()  # the paper's pair set, normalisation and references: what stats reads
    assert len(collected) == 11 * len(LEVELS) and set(collected["model"]) == {"vit_base_in21k"}
    assert set(collected.loc[collected["rank"] == 1, "component"]) == {"mha"} and set(collected["n_pairs"]) == {8}


def test_notebook_07_and_stats_run_with_the_readmes_paper_scale_options(tmp_path):
    from benchmarks.grid import SPEC, build

    assert build(paths.results_dir(), dataset=["flowers102", "pets"], lr=[0.01], seed=[0]) == 14
    command = next(c for c in paper_map()["07_finetune_results"] if c.startswith("-p spec"))
    given = options(command)
    assert given == {"spec": SPEC, "compute_missing": False}
    assert summary.main([str(paths.ROOT / SPEC)]) == 0  # the README's stats command on the same runs
    out = execute.execute(paths.ROOT / "notebooks" / "07_finetune_results.ipynb", tmp_path / "07.ipynb", given)
    said = "".join(
        output.get("text", "") for cell in nbformat.read(out, as_version=4).cells for output in cell.get("outputs", [])
    )
    assert "14 runs: 14 finished; 910 missing" in said
