"""Command lines for one run without a notebook: ``python -m paperlib.finetune`` and
``python -m paperlib.plasticity``.

Both read the notebooks' parameter files (``-f parameters/finetune/cifar10.yaml``, several in
order, later ones winning), then ``--name value`` overrides, with the names the notebooks use.
Values take the type of the parameter's default, so ``--lr 1e-2`` is a number and ``--graph true``
a boolean; an unknown name or a value of the wrong type stops before any work with the valid
choices.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def coerce(name: str, value: Any, default: Any) -> Any:
    """``value`` (from the command line or a parameter file) as the type of ``default``."""
    if isinstance(value, str) and value.strip().lower() in ("none", "null") and default is None:
        return None
    # a YAML null for a text parameter: its default ("" = the default folder)
    if value is None and isinstance(default, str):
        return default
    try:
        if isinstance(value, bool) and not isinstance(default, bool):  # YAML's true for a number is a slip, not 1
            raise ValueError
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word in TRUE + FALSE:
                return word in TRUE
            raise ValueError
        if isinstance(default, int):
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if isinstance(default, float):
            return float(value)
    except (TypeError, ValueError):
        kind = "true or false" if isinstance(default, bool) else type(default).__name__
        raise ValueError(f"{name} must be {kind}, got {value!r}") from None
    return value if value is None or not isinstance(default, str) else str(value)


def parameters(
    argv: list[str] | None,
    defaults: dict[str, Any],
    aliases: dict[str, str],
    description: str,
    prog: str,
    flexible: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Parse ``-f FILE`` parameter files and ``--name value`` overrides into ``defaults``' names.

    ``aliases`` map a command's names to these (``data_root`` -> ``root`` for plasticity's ``run``);
    names in ``flexible`` keep a parameter file's value as it is (``compile``: a boolean or a string).
    """
    valid = sorted(set(defaults) | set(aliases))
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog="parameters: " + ", ".join(valid))
    parser.add_argument(
        "-f", "--file", action="append", default=[], help="a YAML parameter file (as papermill -f); repeatable"
    )
    for name in valid:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=argparse.SUPPRESS, metavar="VALUE")
    args = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    for file in args.pop("file"):
        loaded = yaml.safe_load(Path(file).read_text()) or {}
        if not isinstance(loaded, dict):
            parser.error(f"{file} is not a mapping of parameter names to values")
        unknown = sorted(set(loaded) - set(valid))
        if unknown:
            parser.error(f"{file}: unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
        values.update(loaded)
    values.update(args)
    result = {}
    for name, value in values.items():
        target = aliases.get(name, name)
        default = defaults[target]
        try:
            if target in flexible and isinstance(value, str):
                lowered = value.strip().lower()
                result[target] = (lowered in TRUE) if lowered in TRUE + FALSE else value
            else:
                result[target] = coerce(name, value, default)
        except ValueError as error:
            parser.error(str(error))
    return result


def print_json(payload: dict) -> None:
    print(json.dumps(payload, indent=2, default=str))
