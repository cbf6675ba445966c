"""Sweep specs: what a sweep asks for, read and checked, and expanded into its runs' parameters.

A spec (YAML) names a ``notebook``, fixed ``parameters``, a ``grid`` of lists to expand (in the
order written; or a list of such grids, expanded one after the other), an optional run ``name``
template (default: the grid values joined by ``/``) and optional ``slurm`` settings for submitit.
``sweep`` executes them; ``runs`` reads a finetuning spec's runs.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from pathlib import Path

from paperlib.records import paths
from paperlib.records.cli import coerce, read_yaml

SPEC_KEYS = {"notebook", "parameters", "grid", "name", "slurm"}


def load_spec(path: str | Path) -> dict:
    """Read and check a sweep spec."""
    path = Path(path)
    spec = read_yaml(path, "sweep spec") or {}
    if not isinstance(spec, dict):
        raise ValueError(f"sweep spec {path} is not a mapping of {', '.join(sorted(SPEC_KEYS))}")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ValueError(
            f"unknown keys in {path}: {', '.join(sorted(unknown))}; valid keys: {', '.join(sorted(SPEC_KEYS))}"
        )
    if "notebook" not in spec:
        raise ValueError(f"{path} names no notebook")
    if not grids(spec) or not all(grids(spec)):  # no grid: one run of the defaults, which nobody asked for
        raise ValueError(f"{path} has an empty grid: give it at least one parameter's list of values, e.g. seed: [0]")
    for grid in grids(spec):
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"grid entry {key!r} in {path} must be a non-empty list, got {values!r}")
        overlap = set(grid) & set(spec.get("parameters") or {})
        if overlap:
            raise ValueError(f"{', '.join(sorted(overlap))} both fixed and in the grid of {path}")
    return spec


def grids(spec: dict) -> list[dict]:
    """A spec's grid, or its list of grids (e.g. one per group of datasets with its own steps)."""
    grid = spec.get("grid") or {}
    return grid if isinstance(grid, list) else [grid]


def restrict(spec: dict, **values) -> dict:
    """The spec with only the runs whose parameters take the given values (``key=[value, ...]``).

    For a spec with one grid or a list of them; a ValueError naming the spec's values when no run takes them."""
    fixed = spec.get("parameters") or {}
    kept_grids = []
    for grid in grids(spec):
        kept = dict(grid)
        for key, wanted in values.items():
            if key in grid:
                kept[key] = [value for value in grid[key] if value in wanted]
                if not kept[key]:
                    break
            elif fixed.get(key) not in wanted:
                break
        else:
            kept_grids.append(kept)
    if not kept_grids:
        offered = {
            key: sorted({str(v) for grid in grids(spec) for v in grid.get(key, [fixed.get(key)])}) for key in values
        }
        raise ValueError(
            "the spec has no run with "
            + " and ".join(f"{key} in {list(wanted)}" for key, wanted in values.items())
            + "; its values: "
            + "; ".join(f"{key}: {', '.join(choices)}" for key, choices in offered.items())
        )
    return {**spec, "grid": kept_grids if isinstance(spec.get("grid"), list) else kept_grids[0]}


def _safe(name: str) -> str:
    parts = [re.sub(r"[^A-Za-z0-9_.=+-]", "_", part) for part in name.split("/") if part not in ("", ".", "..")]
    return "/".join(parts) or "run"


def notebook_parameters(notebook: Path) -> dict:
    """The names and default values of a notebook's ``parameters`` cell.

    ``None`` for a default that is not a literal. Read with ``ast``: papermill's ``inspect_notebook`` cannot parse
    every line of ours (a comment holding quotes)."""
    try:  # the notebook's JSON as it is (nbformat: a second to import, for one cell)
        cells = [
            c for c in json.loads(Path(notebook).read_text())["cells"] if "parameters" in c["metadata"].get("tags", [])
        ]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{notebook} is not a notebook ({type(error).__name__}: {error})") from None
    if not cells:
        raise ValueError(f"{notebook} has no cell tagged 'parameters'")
    source = cells[0]["source"]
    defaults = {}
    for node in ast.parse(source if isinstance(source, str) else "".join(source)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                defaults[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                defaults[node.targets[0].id] = None
    return defaults


def _typed(name: str, value, default):
    """A spec's value for a numeric parameter given as a string (YAML reads ``1e-2`` as one) as a number."""
    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    return coerce(name, value, default) if numeric and isinstance(value, str) else value


def cells(spec: dict) -> list[tuple[str, Path, dict]]:
    """The runs of a spec as (name, notebook, parameters).

    The grid's product, in the order its keys and values are written.

    Every parameter must be one of the notebook's (papermill would pass a misspelt one on and the
    notebook would run on its default); numbers written as strings are read as numbers.
    """
    notebook = Path(spec["notebook"])
    if not notebook.is_absolute():
        notebook = paths.ROOT / notebook
    if not notebook.is_file():
        raise FileNotFoundError(f"notebook not found: {notebook}")
    defaults = notebook_parameters(notebook)
    given = set(spec.get("parameters") or {}) | {key for grid in grids(spec) for key in grid}
    unknown = sorted(given - set(defaults))
    if unknown:
        raise ValueError(
            f"{notebook.name} has no parameter {', '.join(unknown)}; its parameters: {', '.join(defaults)}"
        )
    fixed = {key: _typed(key, value, defaults.get(key)) for key, value in (spec.get("parameters") or {}).items()}
    found = []
    for grid in grids(spec):
        for values in itertools.product(*grid.values()):
            cell = {key: _typed(key, value, defaults.get(key)) for key, value in zip(grid, values)}
            template = spec.get("name")
            try:
                name = template.format(**fixed, **cell) if template else "/".join(str(v) for v in values) or "run"
            except (KeyError, IndexError, ValueError) as error:  # a misspelt {key}, a stray brace
                raise ValueError(
                    f"the spec's name template {template!r} cannot be filled ({type(error).__name__}: {error}); "
                    f"its keys can be: {', '.join(sorted({**fixed, **cell}))}"
                ) from None
            found.append((_safe(name), notebook, {**fixed, **cell}))
    names = [name for name, _, _ in found]
    if len(set(names)) != len(names):
        raise ValueError(
            "two runs of the sweep have the same name: give the spec a name template that uses every grid key"
        )
    return found
