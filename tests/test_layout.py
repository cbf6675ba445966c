"""The package's shape: no import circle, no private name used outside its module, modules of a
readable size. Read from the source with ``ast``, every import counted (at the top of a file or
inside a function)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "paperlib"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports, wherever the import stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from .x import f` imports the module x; `from . import x` the module x and, first, the package
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
            targets += [base] if base in MODULES else []
        else:
            continue
        for target in targets:
            # `from . import x` names a module; `from .x import f` a name in one
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if state.get(other) == "open":
                return stack[stack.index(other) :] + [other]
            if other not in state and (found := visit(other)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _reach(name: str) -> set[str]:
    """The package's modules that ``name`` imports, directly or through others."""
    reach, todo = set(), [name]
    while todo:
        for other in GRAPH[todo.pop()] - reach:
            reach.add(other)
            todo.append(other)
    return reach


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_the_package():
    # the reader reads imports
    assert "paperlib.runs" in GRAPH["paperlib.finetune"] and "paperlib.speed.step" in GRAPH["paperlib.finetune"]
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH))


@pytest.mark.parametrize(
    "lower, upper",
    [
        ("paperlib.runs", "paperlib.finetune"),
        ("paperlib.speed.step", "paperlib.runs"),
        ("paperlib.plasticity", "paperlib.bounds"),
        ("paperlib.runs", "paperlib.stats"),
        ("paperlib.plasticity", "paperlib.stats"),
    ],
)
def test_the_layers_import_downwards(lower, upper):
    assert upper not in _reach(lower), f"{lower} reaches {upper}"


ANALYSIS = """
import sys
import pandas as pd
from paperlib import capacity, names, plasticity_table, precision, runs_table, specs, stats
spec = specs.load_spec("parameters/sweeps/finetune_paper.yaml")
found, missing = runs_table.for_spec(spec)
assert len(found) == 0 and len(missing) == 924, (len(found), len(missing))
# a saved P(f) result, read back as stats reads it
rates = pd.DataFrame(
    [(b, 100.0 * b, c, p, 1.0 + i + p) for b in range(2) for i, c in enumerate(names.COMPONENTS) for p in range(3)],
    columns=["block", "depth", "component", "pair", "rate"],
)
record = {"model": "demo", "dataset": "digits", "reference": "digits_source", "sample": "first", "seed": None}
plasticity_table.save(rates, plasticity_table.results_root() / "demo" / "digits", record | {"normalize": "imagenet"})
runs = pd.DataFrame({"model": ["demo"], "normalize": ["imagenet"], "dataset": ["digits"]})
measured, source = stats.plasticity_for(runs)
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
        [sys.executable, "-c", "import sys, paperlib.finetune; print('torch' in sys.modules)"],
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
    from paperlib import notebook
    notebook.headline("a result")
else:
    sys.argv = ["sweep", *sys.argv[1:]]
    runpy.run_module("paperlib.sweep", run_name="__main__")
"""


def test_a_sweeps_plan_runs_without_the_notebook_libraries(tmp_path):
    # --plan and --dry-run render nothing: they run where Jupyter is not installed (a GPU node; an H100 image without
    # IPython failed at import on 2026-11-28)
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


PROTOCOL = ("paperlib.finetune", "paperlib.runs", "paperlib.sweep")


def test_the_speed_layer_never_reaches_the_protocol(tmp_path):
    # paperlib.speed is a layer the protocol calls and never the reverse: no module under it imports
    # finetune, runs or sweep, directly or through another module of the package
    speed = [name for name in GRAPH if name == "paperlib.speed" or name.startswith("paperlib.speed.")]
    assert "paperlib.speed.clock" in speed and "paperlib.speed.step" in speed
    for name in speed:
        assert not _reach(name) & set(PROTOCOL), f"{name} reaches {sorted(_reach(name) & set(PROTOCOL))}"
    # an import inside a function counts: the way a module would hide one
    hidden = tmp_path / "hidden.py"
    hidden.write_text("def run():\n    from .. import finetune\n")
    assert "paperlib.finetune" in _imports("paperlib.speed.hidden", hidden)


BENCHMARKS = PACKAGE.parent / "benchmarks"


def _absolute_imports(name: str, path: Path) -> set[str]:
    """Every module that ``name`` (at ``path``) imports, by its absolute name, the package's or not."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join(parts + ([node.module] if node.module else []))
            found.update([base] if base else [])
            found.update(f"{base}.{alias.name}".lstrip(".") for alias in node.names)  # `from benchmarks import step`
    return found


def _benchmark_imports(modules: dict[str, Path]) -> list[str]:
    """``module -> benchmarks...`` for each import of the benchmarks (``benchmarks/``) by one of ``modules``."""
    return [
        f"{name} -> {target}"
        for name, path in modules.items()
        for target in sorted(_absolute_imports(name, path))
        if target.split(".")[0] == BENCHMARKS.name
    ]


def _bench_modules(modules) -> list[str]:
    """The modules among ``modules`` (names) that hold benchmarks: named ``bench...``."""
    return [name for name in modules if name.rpartition(".")[2].startswith("bench")]


def test_the_package_never_imports_the_benchmarks_and_holds_none(tmp_path):
    # the benchmarks (benchmarks/, `python -m benchmarks`) use the package; the package, and what a run
    # imports (paperlib.speed: options, step, layers, kernels, clock), never uses them
    assert (BENCHMARKS / "step.py").is_file() and "paperlib.speed.step" in MODULES
    assert not _benchmark_imports(MODULES), _benchmark_imports(MODULES)
    assert not _bench_modules(MODULES), _bench_modules(MODULES)
    # and the checks can fail: an import of the benchmarks, at the top or hidden in a function, relative or not
    hidden = tmp_path / "hidden.py"
    hidden.write_text(
        "import benchmarks.data\ndef run():\n    from benchmarks import step\n    from ... import benchmarks\n"
    )
    found = _benchmark_imports({"paperlib.speed.hidden": hidden})
    assert found == [
        "paperlib.speed.hidden -> benchmarks",
        "paperlib.speed.hidden -> benchmarks.data",
        "paperlib.speed.hidden -> benchmarks.step",
    ], found
    assert _bench_modules(["paperlib.speed.step", "paperlib.speed.bench", "paperlib.bench_data"]) == [
        "paperlib.speed.bench",
        "paperlib.bench_data",
    ]


def test_no_private_name_of_the_package_is_used_outside_its_module():
    used = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = {}  # local names bound to the package's modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name.startswith("_") and node.level and alias.name != "__version__":
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


def test_modules_stay_readable():
    # the package's modules and the benchmarks' (benchmarks/*.py) alike
    modules = {**MODULES, **{f"benchmarks.{path.stem}": path for path in sorted(BENCHMARKS.glob("*.py"))}}
    lines = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    assert lines["paperlib.finetune"] < 500, lines["paperlib.finetune"]
    assert "benchmarks.step" in lines and max(lines.values()) <= 700, max(lines.items(), key=lambda item: item[1])


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
    assert callers == ["paperlib.significance"], callers
    # and the check can fail: a call through any name, an import; a docstring's mention is none
    assert _names_kendalltau("from scipy import stats as s\ntau = s.kendalltau(x, y).statistic")
    assert _names_kendalltau("from scipy.stats import kendalltau")
    assert _names_kendalltau("import scipy.stats\nscipy.stats.kendalltau([1, 2], [2, 1])")
    assert not _names_kendalltau('"""Kendall\'s tau (scipy\'s ``kendalltau``)."""  # kendalltau')


def _help_formatters(source: str) -> list[str]:
    """The classes ``source`` defines on an argparse help formatter (a base named ``...HelpFormatter``)."""
    classes = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]
    bases = {node.name: [getattr(b, "attr", None) or getattr(b, "id", "") for b in node.bases] for node in classes}
    return [name for name, named in bases.items() if any(base.endswith("HelpFormatter") for base in named)]


def test_one_help_formatter_for_every_command_the_benchmarks_included():
    files = sorted(PACKAGE.rglob("*.py")) + sorted((PACKAGE.parent / "benchmarks").rglob("*.py"))
    found = {str(path.relative_to(PACKAGE.parent)): _help_formatters(path.read_text()) for path in files}
    assert {path: names for path, names in found.items() if names} == {"paperlib/cli.py": ["Help"]}
    # and the check can fail
    assert _help_formatters("import argparse\nclass H(argparse.RawDescriptionHelpFormatter): pass") == ["H"]


def _module_map(text: str) -> list[str]:
    """The modules a module map lists (``- ``name`` what it holds`` lines), in its order."""
    return [line.split("``")[1] for line in text.splitlines() if line.startswith("- ``")]


def _map_out_of_order(listed: list[str], graph: dict[str, set[str]], package: str) -> list[str]:
    """``listed``'s modules (under ``package``) that import one listed below them, or themselves unlisted."""
    top = {name: name.removeprefix(package + ".").split(".")[0] for name in graph if name.startswith(package + ".")}
    wrong = []
    for name, short in top.items():
        below = [top[other] for other in graph[name] if other in top and top[other] != short]
        if short not in listed or any(b not in listed or listed.index(b) > listed.index(short) for b in below):
            wrong.append(f"{name} -> {below}")
    return sorted(set(wrong))


def test_the_module_maps_list_every_module_in_the_order_they_import_one_another():
    for package, folder in (("paperlib", PACKAGE), ("paperlib.speed", PACKAGE / "speed")):
        listed = _module_map(ast.get_docstring(ast.parse((folder / "__init__.py").read_text())))
        modules = sorted(
            {name.removeprefix(package + ".").split(".")[0] for name in MODULES if name.startswith(package + ".")}
        )
        assert sorted(listed) == modules, (package, set(listed) ^ set(modules))
        assert _map_out_of_order(listed, GRAPH, package) == [], package
    # and the check can fail: a module listed above one it imports, or not listed
    graph = {"p.a": {"p.b"}, "p.b": set()}
    assert _map_out_of_order(["a", "b"], graph, "p") == ["p.a -> ['b']"]
    assert _map_out_of_order(["b"], graph, "p") == ["p.a -> ['b']"]
    assert _map_out_of_order(["b", "a"], graph, "p") == []


MOST_PARAMETERS = 8
TRITON_KERNELS = {f"paperlib.speed.kernels._triton_kernels.{name}" for name in ("backward_kernel", "stack_kernel")}
"""The only functions allowed more parameters: Triton kernels, whose arguments are the kernel's launch contract."""


def _parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> int:
    """How many parameters ``function`` takes: every named one, ``*args`` and ``**kwargs`` one each,
    less a leading ``self`` or ``cls``."""
    arguments = function.args
    named = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    count = len(named) + (arguments.vararg is not None) + (arguments.kwarg is not None)
    return count - (bool(named) and named[0] in ("self", "cls"))


def _too_many_parameters(name: str, source: str) -> dict[str, int]:
    """``module.function`` (``module.Class.method``, nested ones by their path) -> its parameter count, for
    each function of ``source`` (module ``name``) that takes more than ``MOST_PARAMETERS``."""
    found = {}

    def visit(node, path):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = f"{path}.{child.name}"
                if not isinstance(child, ast.ClassDef) and _parameter_count(child) > MOST_PARAMETERS:
                    found[inner] = _parameter_count(child)
                visit(child, inner)
            else:
                if isinstance(child, ast.Lambda) and _parameter_count(child) > MOST_PARAMETERS:
                    found[f"{path}.<lambda>"] = _parameter_count(child)
                visit(child, path)

    visit(ast.parse(source), name)
    return found


def test_no_function_takes_more_than_eight_parameters():
    # what would take more takes a value that groups the ones that form one idea (loader.Transform,
    # plasticity.PairDraw and Running, speed.step.OptimizerSettings)
    found = {}
    for name, path in MODULES.items():
        found |= _too_many_parameters(name, path.read_text())
    allowed = TRITON_KERNELS
    assert set(found) - allowed == set(), {k: v for k, v in found.items() if k not in allowed}
    assert set(found) == allowed  # each exemption names a function that needs it: one that names nothing is dropped
    # and the counter can fail: nine parameters anywhere; self and cls not counted, *args and **kwargs one each
    nine = "def f(a, b, c, d, e, f, g, h, i):\n    pass\n"
    assert _too_many_parameters("m", nine) == {"m.f": 9}
    method = "class C:\n    def m(self, a, b, c, d, e, f, g, h, *args, **kwargs):\n        pass\n"
    assert _too_many_parameters("m", method) == {"m.C.m": 10}
    assert _too_many_parameters("m", "class C:\n    def m(self, a, b, c, d, e, f, g, h):\n        pass\n") == {}
    nested = "def outer():\n    def inner(a, *, b, c, d, e, f, g, h, i=0):\n        pass\n"
    assert _too_many_parameters("m", nested) == {"m.outer.inner": 9}


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


SUMMARISED = set(MODULES)
"""The modules whose docstrings are held to ``_unsummarised`` (issue 44, item 10): every module of the package."""


def _unsummarised(name: str, source: str) -> list[str]:
    """``module.name`` of each public function and class at the top of ``source`` whose docstring does not
    open with a one-line summary: a first line ending with a period, then a blank line if more follows."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            lines = (ast.get_docstring(node) or "").split("\n")
            if not lines[0].strip().endswith(".") or (len(lines) > 1 and lines[1].strip()):
                found.append(f"{name}.{node.name}")
    return found


def test_public_functions_and_classes_open_their_docstrings_with_a_one_line_summary():
    assert "paperlib.speed.step" in SUMMARISED and SUMMARISED <= set(MODULES)
    found = [where for name in sorted(SUMMARISED) for where in _unsummarised(name, MODULES[name].read_text())]
    assert found == [], found
    # and the check can fail: no docstring, a sentence over two lines, no blank line after the summary
    source = (
        'def a():\n    pass\n\ndef b():\n    """One\n    sentence."""\n\n'
        'def c():\n    """Summary.\n    More."""\n\nclass D:\n    """Summary.\n\n    More."""\n\ndef _e():\n    pass\n'
    )
    assert _unsummarised("m", source) == ["m.a", "m.b", "m.c"]
