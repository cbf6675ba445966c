"""Command lines for one run without a notebook (``finetune``, ``plasticity``), and what every command line shares.

``python -m paperlib finetune`` and ``python -m paperlib plasticity`` both read the notebooks' parameter files
(``-f parameters/finetune/cifar10.yaml``, several in order, later ones winning), then ``--name value`` overrides, with
the names the notebooks use. Values take the type of the parameter's default, so ``--lr 1e-2`` is a number and
``--save-weights true`` a boolean; an unknown name or a value of the wrong type stops before any work with the valid
choices. Every command (these, ``sweep``, ``stats``, ``report``, ``demo``, ``python -m benchmarks``) reports a missing
or malformed file, spec or folder as one line, ``error: ...``, with exit status 2 (``BAD_INPUT``, ``fail``). Their
``--help`` gives each option its meaning, type, valid choices and default: these two's from ``Config``'s field comments
(``field_comments``), the others' from their ``add_argument`` (``Help``).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from paperlib.records import storage

BAD_INPUT = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, storage.CannotWrite)
"""What a command line reports as a bad input (``fail``), not as a traceback: a file in the way, a disk that refuses
a file too."""


def fail(error: BaseException) -> int:
    """Report a bad input as one line on stderr (``error: ...``); returns the exit status, 2."""
    print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
    return 2


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping of a YAML file (``UniqueKeys``); its message names the key and its lines."""


class UniqueKeys(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a key given twice in one mapping (nested mappings too).

    ``yaml.safe_load`` keeps the last of two values of one key without a word, so that a slip in a parameter file
    (``steps: 20``, then ``steps: 30`` further down) would run with a value the reader may not see. A key that a
    merge (``<<: *defaults``) brings and the mapping sets again is not a duplicate: that is what a merge is for."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                continue
            if key in lines:
                raise DuplicateKey(f"the key {key!r} is given twice (lines {lines[key]} and {line})")
            lines[key] = line
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path, what: str = "parameter file") -> Any:
    """A YAML file's content.

    A FileNotFoundError or ValueError naming it (and ``what`` it is) if it is missing, a folder, not YAML, or gives a
    key twice in one mapping (``UniqueKeys``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}" + (" (a folder)" if path.is_dir() else ""))
    try:
        return yaml.load(path.read_text(), Loader=UniqueKeys)
    except DuplicateKey as error:
        raise ValueError(f"{what} {path}: {error}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"{what} {path} is not valid YAML: {' '.join(str(error).split())}") from None


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


def field_comments(cls) -> dict[str, str]:
    """Each field of a dataclass with its comment in the source.

    The comment lines just above it and the one after it on its line (``runs.Run`` documents its fields
    so; ``--help`` shows them), in ``cls`` and the dataclasses it derives from."""
    names, comments, pending = {f.name for f in dataclasses.fields(cls)}, {}, []
    source = "\n".join(inspect.getsource(c) for c in reversed(cls.__mro__) if dataclasses.is_dataclass(c))
    for line in source.splitlines():
        stripped = line.strip()
        field = re.match(r"(\w+)\s*:", stripped)
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            pending += [] if text.startswith("---") else [text]
        elif field and field.group(1) in names:
            trailing = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            comments[field.group(1)] = " ".join(pending + ([trailing] if trailing else []))
            pending = []
        else:
            pending = []
    return comments


def field_defaults(cls) -> dict[str, Any]:
    """Each field of a dataclass with its default, by name (what a command line starts from)."""
    return {field.name: field.default for field in dataclasses.fields(cls)}


class Help(argparse.HelpFormatter):
    """``--help`` that shows each argument's meaning, then its type, choices and default.

    ``--help`` of the commands that declare their options with ``add_argument`` (``formatter_class=cli.Help``):
    each argument's ``help`` (its meaning), then, in parentheses, what its ``add_argument`` says: its type
    (``flag`` for an option without a value), its valid ``choices`` and its ``default``. An option whose
    default is None (or a path of this machine) ends its help with it in words, ``; default: <words>``
    (``--gpus``: ``; default: every visible GPU``), shown in the parentheses."""

    TYPES = {None: "str", str: "str", int: "int", float: "float", Path: "path"}

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        # a description: each paragraph (between blank lines) filled on its own; a heading's list kept as written
        filled = []
        for paragraph in text.strip("\n").split("\n\n"):
            head, *rest = paragraph.splitlines()
            if rest and all(line.startswith(" ") for line in rest):
                filled.append(super()._fill_text(head, width, indent) + "".join(f"\n{indent}{line}" for line in rest))
            else:
                filled.append(super()._fill_text(paragraph, width, indent))
        return "\n\n".join(filled)

    def _get_help_string(self, action: argparse.Action) -> str:
        # a subcommand's line in its parent's list, or --help itself: the help as it is
        if not (action.option_strings or action.required) or action.default is argparse.SUPPRESS:
            return action.help
        meaning, _, absent = (action.help or "").partition("; default: ")
        if action.nargs == 0:
            facts = ["flag"]
        else:
            facts = [self.TYPES.get(action.type, getattr(action.type, "__name__", "value"))]
            facts[0] += ", one or more" if action.nargs == "+" else ""
            facts += [] if action.choices is None else ["one of %(choices)s"]
            if absent:
                facts.append(f"default: {absent}")
            elif action.default is not None and not action.required:
                facts.append("default %(default)s")
        return f"{meaning} ({'; '.join(facts)})"


def parameters_parser(
    defaults: dict[str, Any], description: str, prog: str, meanings: dict[str, str]
) -> argparse.ArgumentParser:
    """The command line of ``-f FILE`` parameter files and ``--name value`` overrides of ``defaults``' names.

    ``--help`` shows each option's meaning (``meanings``), type and default; ``parse_parameters`` reads what it
    parses."""
    valid = sorted(defaults)
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog="parameters: " + ", ".join(valid))
    parser.add_argument(
        "-f", "--file", action="append", default=[], help="a YAML parameter file (as papermill -f); repeatable"
    )
    for name in valid:
        default = defaults[name]
        kind = (
            "true or false" if isinstance(default, bool) else type(default).__name__ if default is not None else "value"
        )
        meaning = meanings.get(name, "").replace("%", "%%")
        shown = repr(default) if default == "" else str(default).replace("%", "%%")  # unquoted, as argparse's own
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=argparse.SUPPRESS,
            metavar="BOOL" if isinstance(default, bool) else kind.upper(),
            help=f"{meaning + ' ' if meaning else ''}({kind}; default {shown})",
        )
    return parser


def parse_parameters(
    argv: list[str] | None,
    parser: argparse.ArgumentParser,
    defaults: dict[str, Any],
    flexible: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Parse ``-f FILE`` parameter files and ``--name value`` overrides into ``defaults``' names.

    ``parser``: ``parameters_parser`` of ``defaults``. Names in ``flexible`` keep a parameter file's value as it is
    (``compile``: a boolean or a string). A missing or malformed file, an unknown name in a file or a bad value raises
    FileNotFoundError or ValueError (for ``fail``); an unknown option stops in argparse, with the usage.
    """
    valid = sorted(defaults)
    args = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    for file in args.pop("file"):  # a file's problems: FileNotFoundError or ValueError naming it (``fail``)
        loaded = read_yaml(file)
        if loaded is None:
            raise ValueError(f"{file} is empty: no parameters in it")
        if not isinstance(loaded, dict):
            raise ValueError(f"{file} is not a mapping of parameter names to values")
        unknown = sorted(set(loaded) - set(valid))
        if unknown:
            raise ValueError(f"{file}: unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
        values.update(loaded)
    values.update(args)
    result = {}
    for name, value in values.items():
        if name in flexible and isinstance(value, str):
            lowered = value.strip().lower()
            result[name] = (lowered in TRUE) if lowered in TRUE + FALSE else value
        else:
            result[name] = coerce(name, value, defaults[name])
    return result
