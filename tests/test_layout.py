"""The package's shape: its packages and their contracts (import-linter, from ``pyproject.toml``), what reads results
without a training stack, and the rules the linter has no name for. ``docs/architecture.md`` draws it."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter brings tomli
    import tomli as tomllib

PACKAGE = Path(__file__).resolve().parents[1] / "paperlib"
ROOT = PACKAGE.parent
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
LAYERS = next(contract["layers"] for contract in CONTRACTS if contract["type"] == "layers")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the package found first under ``root``, with the project's contracts."""
    env = os.environ | {"PYTHONPATH": str(root)}
    command = [str(Path(sys.executable).with_name("lint-imports")), "--config", str(ROOT / "pyproject.toml")]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)


def test_the_package_is_its_packages_each_in_a_layer_of_the_contracts():
    # `ls paperlib`: the package's map, its command line, the demo weights and one folder per layer
    entries = {path.name for path in PACKAGE.iterdir() if path.name != "__pycache__"}
    assert entries == {"__init__.py", "__main__.py", "assets"} | {name.split(".")[1] for name in LAYERS}
    assert all((PACKAGE / name.split(".")[1] / "__init__.py").is_file() for name in LAYERS)


def test_the_architecture_drawing_is_the_packages_imports():
    """``docs/architecture.md``'s diagram draws an arrow for each package that imports another, and no other."""
    import grimp

    text = (ROOT / "docs" / "architecture.md").read_text()
    diagram = text.split("```mermaid", 1)[1].split("```", 1)[0]
    drawn = set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", diagram, flags=re.MULTILINE))
    graph = grimp.build_graph("paperlib")
    packages = [name.split(".")[1] for name in LAYERS]
    imports = {
        (a, b)
        for a in packages
        for b in packages
        if a != b and graph.direct_import_exists(importer=f"paperlib.{a}", imported=f"paperlib.{b}", as_packages=True)
    }
    assert drawn == imports, (
        f"drawn, not imported: {sorted(drawn - imports)}; imported, not drawn: {sorted(imports - drawn)}"
    )


def test_the_package_keeps_its_contracts():
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("records/names.py", "from paperlib.train import finetune", "Packages import downwards"),
        ("analysis/tables.py", "import torch", "Reading results needs no training stack"),
        ("speed/clock.py", "def f():\n    import benchmarks.step", "The package never imports its benchmarks"),
        ("records/names.py", "import triton", "Reading results needs no training stack"),
        ("speed/clock.py", "from paperlib.analysis import tables", "Speed and analysis are independent"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(tmp_path, module, line, contract):
    # the contracts can fail: a copy of the package with one forbidden import added (in a function, too)
    shutil.copytree(PACKAGE, tmp_path / "paperlib", ignore=shutil.ignore_patterns("assets", "__pycache__"))
    target = tmp_path / "paperlib" / module
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    done = _lint_imports(tmp_path)
    assert done.returncode == 1 and f"{contract} BROKEN" in done.stdout, done.stdout[-3000:]


def _imports_in_functions(source: str) -> list[str]:
    """The package's own modules that ``source`` imports inside a function (line: module)."""
    found = set()
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                relative = isinstance(node, ast.ImportFrom) and node.level
                found |= {f"{node.lineno}: {n}" for n in names if relative or n.split(".")[0] == "paperlib"}
    return sorted(found)


def test_no_package_internal_import_sits_inside_a_function():
    # an import inside a function is how a module hides a dependency from its reader (and a circle from Python)
    found = {name: _imports_in_functions(path.read_text()) for name, path in MODULES.items()}
    assert {name: lines for name, lines in found.items() if lines} == {}
    # and the check can fail: relative or absolute, however deep
    source = "import torch\ndef f():\n    import torch\n    from . import x\n    def g():\n        import paperlib.y\n"
    assert _imports_in_functions(source) == ["4: ", "6: paperlib.y"]


ANALYSIS = """
import sys
import pandas as pd
from paperlib.analysis import capacity, component_tests, lora_comparison, plasticity_table, precision_check
from paperlib.analysis import summary, tables
from paperlib.records import measurements, names, runs_table, specs
spec = specs.load_spec("parameters/sweeps/finetune_paper.yaml")
found, missing = runs_table.for_spec(spec)
assert len(found) == 0 and len(missing) == 924, (len(found), len(missing))
# a saved P(f) result, read back as stats reads it
rates = pd.DataFrame(
    [(b, 100.0 * b, c, p, 1.0 + i + p) for b in range(2) for i, c in enumerate(names.COMPONENTS) for p in range(3)],
    columns=["block", "depth", "component", "pair", "rate"],
)
found = {"n_pairs": 3, "distinct_reference": 3, "distinct_target": 3, "identical_pairs_excluded": 0, "token_rms": 1.0}
plasticity_table.save(rates, measurements.Measurement(), found)
runs = pd.DataFrame({"model": ["demo"], "normalize": ["imagenet"], "dataset": ["digits"]})
measured, source = component_tests.plasticity_for(runs)
assert source == "measured" and len(measured) == 5, (source, measured)
heavy = sorted(name for name in ("torch", "torchvision", "timm", "sklearn") if name in sys.modules)
print(",".join(heavy) or "none")
"""


def test_reading_a_grids_results_loads_no_training_stack(tmp_path):
    # the analysis of finished runs (stats, precision, capacity, the runs of a spec, saved P(f)) in a fresh process:
    # no torch
    env = os.environ | {"VIT_PLASTICITY_RESULTS": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", ANALYSIS], cwd=PACKAGE.parent, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "none"
    # and the check can fail: importing what trains loads torch
    trains = subprocess.run(
        [sys.executable, "-c", "import sys, paperlib.train.finetune; print('torch' in sys.modules)"],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    assert trains.stdout.strip() == "True"


WITHOUT_JUPYTER = """
import importlib.abc, runpy, sys

NOTEBOOK_EXTRA = ("IPython", "ipykernel", "nbclient", "nbconvert", "nbformat", "papermill", "traitlets")

class Absent(importlib.abc.MetaPathFinder):  # a machine with the package's dependencies and not its notebook extra
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in NOTEBOOK_EXTRA:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
if sys.argv[1] == "headline":
    from paperlib.reports import notebook
    notebook.headline("a result")
else:
    sys.argv = ["paperlib", "sweep", *sys.argv[1:]]
    runpy.run_module("paperlib", run_name="__main__")
"""


def test_a_sweeps_plan_runs_without_the_notebook_libraries(tmp_path):
    # --plan and --dry-run render nothing: they run where Jupyter is not installed (a GPU node, an image without
    # IPython)
    env = os.environ | {"VIT_PLASTICITY_RESULTS": str(tmp_path)}
    said = {}
    for option in ("--plan", "--dry-run"):
        done = subprocess.run(
            [sys.executable, "-c", WITHOUT_JUPYTER, "parameters/sweeps/finetune_demo.yaml", option],
            cwd=PACKAGE.parent,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        said[option] = done.stdout.splitlines()
    assert [line.split()[:2] for line in said["--plan"] if line.startswith("total ")] == [["total", "42"]]
    assert sum(line.startswith("to run") for line in said["--dry-run"]) == 42
    # and the check can fail: what a notebook's cell calls needs IPython
    shown = subprocess.run(
        [sys.executable, "-c", WITHOUT_JUPYTER, "headline"], cwd=PACKAGE.parent, capture_output=True, text=True
    )
    assert shown.returncode == 1 and "No module named 'IPython" in shown.stderr, shown.stderr[-2000:]


def _module_map(text: str) -> list[str]:
    """The modules a package's map lists (``- ``name`` what it holds`` lines), in its order."""
    return [line.split("``")[1] for line in text.splitlines() if line.startswith("- ``")]


def test_each_package_lists_its_modules_and_the_package_lists_its_packages():
    for layer in LAYERS:
        folder = PACKAGE / layer.split(".")[1]
        listed = _module_map(ast.get_docstring(ast.parse((folder / "__init__.py").read_text())))
        assert sorted(listed) == sorted(path.stem for path in folder.glob("*.py") if path.stem != "__init__"), layer
    top = _module_map(ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())))
    assert top == [layer.split(".")[1] for layer in LAYERS]  # top down, as the layers contract orders them
    assert _module_map("- ``a``  one\ntext\n- ``b``  two") == ["a", "b"]


def test_no_private_name_of_the_package_is_used_outside_its_module():
    used = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = {}  # local names bound to the package's modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    internal = node.level or (node.module or "").startswith("paperlib")
                    if alias.name.startswith("_") and internal and alias.name != "__version__":
                        used.append(f"{name}: from {'.' * node.level}{node.module or ''} import {alias.name}")
                    aliases[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and any(module.rpartition(".")[2] == aliases[node.value.id] for module in MODULES)
            ):
                used.append(f"{name}: {node.value.id}.{node.attr}")
    assert not used, used


def _names_kendalltau(source: str) -> bool:
    """Whether ``source``'s code names scipy's ``kendalltau`` (an attribute, a name or an import, under
    whatever name scipy's stats is imported); a mention in a docstring or a comment does not count."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "kendalltau":
            return True
        if isinstance(node, ast.Name) and node.id == "kendalltau":
            return True
        if isinstance(node, ast.alias) and node.name.rpartition(".")[2] == "kendalltau":
            return True
    return False


def test_kendalls_tau_is_computed_in_significance_alone():
    # one home: significance.kendall_tau (and kendall, with its p-value); every other module calls them
    callers = sorted(name for name, path in MODULES.items() if _names_kendalltau(path.read_text()))
    assert callers == ["paperlib.analysis.significance"], callers
    # and the check can fail: a call through any name, an import; a docstring's mention is none
    assert _names_kendalltau("from scipy import stats as s\ntau = s.kendalltau(x, y).statistic")
    assert _names_kendalltau("from scipy.stats import kendalltau")
    assert _names_kendalltau("import scipy.stats\nscipy.stats.kendalltau([1, 2], [2, 1])")
    assert not _names_kendalltau('"""Kendall\'s tau (scipy\'s ``kendalltau``)."""  # kendalltau')
    # and Kendall's S, the statistic the permutation tests count, is defined there alone too
    defining = sorted(name for name, path in MODULES.items() if _defines_kendall(path.read_text()))
    assert defining == ["paperlib.analysis.significance"], defining


def _defines_kendall(source: str) -> bool:
    """Whether ``source`` defines a function of Kendall's statistic (its name says so)."""
    functions = (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return any(f.name.lower().lstrip("_").startswith(("kendall", "tau")) for f in functions)


def _help_formatters(source: str) -> list[str]:
    """The classes ``source`` defines on an argparse help formatter (a base named ``...HelpFormatter``)."""
    classes = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]
    bases = {node.name: [getattr(b, "attr", None) or getattr(b, "id", "") for b in node.bases] for node in classes}
    return [name for name, named in bases.items() if any(base.endswith("HelpFormatter") for base in named)]


def test_one_help_formatter_for_every_command_the_benchmarks_included():
    files = sorted(PACKAGE.rglob("*.py")) + sorted((PACKAGE.parent / "benchmarks").rglob("*.py"))
    found = {str(path.relative_to(PACKAGE.parent)): _help_formatters(path.read_text()) for path in files}
    assert {path: names for path, names in found.items() if names} == {"paperlib/records/cli.py": ["Help"]}
    # and the check can fail
    assert _help_formatters("import argparse\nclass H(argparse.RawDescriptionHelpFormatter): pass") == ["H"]


def _test_file_imports(source: str) -> list[str]:
    """The test modules (``test_*``) a test file's source imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("test_"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("test_")]
    return found


def test_test_files_share_helpers_through_conftest_not_each_other():
    tests = PACKAGE.parent / "tests"
    importing = {path.name: _test_file_imports(path.read_text()) for path in sorted(tests.glob("test_*.py"))}
    assert {name: found for name, found in importing.items() if found} == {}
    assert _test_file_imports("from test_finetune import same_metrics\nimport test_lora") == [
        "test_finetune",
        "test_lora",
    ]
    assert _test_file_imports("from conftest import same_metrics") == []
