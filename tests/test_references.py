"""Every dotted name of the package that its documentation writes resolves: the code spans and code blocks of
``docs/*.md`` and the README, the double-backtick spans of every docstring of ``paperlib`` (and of every string that
documents an assignment) and its comments name modules and attributes that exist (``runs.Run``,
``paperlib.speed.threads``, ``speed.step.Step.network``). A name that moved or went away fails the test with where it
is written, so that it is fixed where it stands."""

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

from paperlib import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "paperlib"

EXTENSIONS = frozenset(
    "py pyc json jsonl csv npz npy md yaml yml sh ipynb html pt pth safetensors txt png pdf svg toml cfg gz zip tar "
    "log lock mat jpg jpeg bin".split()
)
"""What ends a file's name: a chain that ends with one of these names a file (``runs.csv``), not an attribute."""

CHAIN = re.compile(r"(?<![\w./\\-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
"""A dotted chain of identifiers, whole (the longest there is): never the tail of a longer chain
(``torch.utils.data.random_split`` is torch's, not ``data``'s) nor of a path (``src/vitef/utils.py``) or a hyphenated
name (``vit-plasticity.x``)."""


def module_names() -> list[str]:
    """Every module and package of ``paperlib`` by its dotted name, read from its files (nothing imported)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = module_names()
LAST_NAMES = frozenset(name.rpartition(".")[2] for name in MODULES)


def chains(code: str, local: frozenset = frozenset()) -> list[tuple[int, str]]:
    """The dotted names of the package that a piece of code writes (``speed.threads``, ``runs.Run.folder``), each
    with its line in the code (from 0): those that start with ``paperlib`` or with the last name of one of its
    modules, except a name of ``local`` (the parameters of the function whose docstring it is: ``config.image_size``
    is the argument's) and files."""
    found = []
    for match in CHAIN.finditer(code):
        parts = match[0].split(".")
        if parts[0] != "paperlib" and (parts[0] not in LAST_NAMES or parts[0] in local):
            continue  # another package's name or a variable's: np.mean, run.config, a parameter named config
        if parts[-1] in EXTENSIONS or re.match(r"[/\\]|-\w", code[match.end() :]):
            continue  # a file's name (runs.csv, a.tar.gz), or the start of a path or of a hyphenated name
        found.append((code.count("\n", 0, match.start()), match[0]))
    return found


def markdown_code(text: str) -> list[tuple[int, str]]:
    """A Markdown text's code with the line (from 1) each piece starts on: its fenced blocks and its code spans."""
    blocks = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
    found = [(text.count("\n", 0, match.start(1)) + 1, match[1]) for match in blocks.finditer(text)]
    rest = blocks.sub(lambda match: "\n" * match[0].count("\n"), text)  # what is left keeps its line numbers
    spans = re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", rest)
    return sorted(found + [(rest.count("\n", 0, match.start(1)) + 1, match[1]) for match in spans])


def docstrings(tree: ast.Module) -> list[tuple[str, ast.Constant, frozenset]]:
    """Every docstring of a module, of its classes, functions and methods, with its owner's qualified name and, for
    a function's, its parameters; and every string that documents an assignment (a string expression right after
    it, in a module or a class), owned by what it assigns."""
    found = []

    def walk(node, owner: str):
        body = getattr(node, "body", [])
        local = frozenset()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            local = frozenset(argument.arg for argument in every if argument)
        for i, child in enumerate(body):
            if isinstance(child, ast.Expr) and isinstance(getattr(child.value, "value", None), str):
                if i == 0:
                    found.append((owner, child.value, local))
                elif isinstance(body[i - 1], (ast.Assign, ast.AnnAssign)):
                    previous = body[i - 1]
                    target = previous.targets[0] if isinstance(previous, ast.Assign) else previous.target
                    found.append((".".join(filter(None, [owner, ast.unparse(target)])), child.value, local))
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, ".".join(filter(None, [owner, child.name])))

    walk(tree, "")
    return found


def comments(source: str) -> list[tuple[int, str]]:
    """The comments of a Python source, with their lines."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(token.start[0], token.string) for token in tokens if token.type == tokenize.COMMENT]


def instance_attributes(tree: ast.Module, module: str) -> dict[str, set[str]]:
    """What the methods of each class of a module assign on ``self`` (``Step.network``), by class
    (``module:qualified name``)."""
    found = {}

    def walk(node, owner: str):
        for child in getattr(node, "body", []):
            if isinstance(child, ast.ClassDef):
                name = ".".join(filter(None, [owner, child.name]))
                found[f"{module}:{name}"] = {
                    target.attr
                    for target in ast.walk(child)
                    if isinstance(target, ast.Attribute)
                    and isinstance(target.ctx, ast.Store)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                }
                walk(child, name)

    walk(tree, "")
    return found


def documentation() -> tuple[list[tuple[str, int, str, frozenset]], dict[str, set[str]]]:
    """Every piece of code the documentation writes, as (where, line, code, names local to it), and the instance
    attributes of the package's classes (``instance_attributes``)."""
    pieces, attributes = [], {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        where = str(path.relative_to(ROOT))
        pieces += [(where, line, code, frozenset()) for line, code in markdown_code(path.read_text())]
    for path, module in zip(sorted(PACKAGE.rglob("*.py")), MODULES):
        where, source = str(path.relative_to(ROOT)), path.read_text()
        tree = ast.parse(source)
        attributes.update(instance_attributes(tree, module))
        for owner, node, local in docstrings(tree):
            label = f"{where} ({owner})" if owner else where
            for span in re.finditer(r"``(.+?)``", node.value, re.S):
                line = node.lineno + node.value.count("\n", 0, span.start())
                pieces.append((label, line, span[1], local))
        pieces += [(f"{where} (a comment)", line, text, frozenset()) for line, text in comments(source)]
    return pieces, attributes


def resolves(chain: str, attributes: dict[str, set[str]]) -> bool:
    """Whether a dotted name is a module of the package or an attribute of one: each module whose name ends with
    the longest start of it that any module's name ends with, imported, and the rest of it looked up there."""
    parts = chain.split(".")
    if parts[0] == "paperlib" and len(parts) == 2 and parts[1] in COMMANDS:
        return True  # python -m paperlib.<command>, answered by the package's finder (CommandNames)
    for length in range(len(parts), 0, -1):
        head = ".".join(parts[:length])
        owners = [name for name in MODULES if name == head or name.endswith("." + head)]
        if owners:
            return any(has(importlib.import_module(owner), parts[length:], attributes) for owner in owners)
    return False


def has(value, names: list[str], attributes: dict[str, set[str]]) -> bool:
    """Whether ``value.<names>`` exists; a field of a dataclass or a NamedTuple without a default, or what a class's
    methods assign on ``self``, count as attributes (with nothing to look further into)."""
    for name in names:
        if hasattr(value, name):
            value = getattr(value, name)
            continue
        classes = getattr(value, "__mro__", ()) if isinstance(value, type) else ()
        fields = {field for cls in classes for field in getattr(cls, "__annotations__", {})}
        fields |= set(getattr(value, "__dataclass_fields__", {}))
        fields |= {a for cls in classes for a in attributes.get(f"{cls.__module__}:{cls.__qualname__}", ())}
        return name in fields
    return True


def unresolved(pieces: list[tuple[str, int, str, frozenset]], attributes: dict[str, set[str]]) -> list[str]:
    """Each dotted name of the package in these pieces that does not resolve, with where it is written."""
    return [
        f"{where}:{line + offset}: {chain}"
        for where, line, code, local in pieces
        for offset, chain in chains(code, local)
        if not resolves(chain, attributes)
    ]


def test_every_dotted_name_of_the_package_in_the_documentation_resolves():
    pieces, attributes = documentation()
    names = [chain for _, _, code, local in pieces for _, chain in chains(code, local)]
    assert len(names) > 500  # what the walk finds; far fewer: it lost its way
    stale = unresolved(pieces, attributes)
    assert not stale, "names that do not resolve; write the one that exists now:\n" + "\n".join(stale)


def test_a_name_that_does_not_resolve_is_reported():
    _, attributes = documentation()
    resolving = "runs.Run.folder(), speed.step.Step.network, runs.Run.component, torch.utils.data.x, a/runs.x"
    pieces = [
        ("synthetic.md", 3, "runs.NoSuchThing and paperlib.records.runs.Run.nothing()", frozenset()),
        ("synthetic.md", 4, resolving, frozenset()),
        ("synthetic.py (f)", 5, "config.image_size, data.csv, python -m paperlib.sweep", frozenset({"config"})),
    ]
    assert unresolved(pieces, attributes) == [
        "synthetic.md:3: runs.NoSuchThing",
        "synthetic.md:3: paperlib.records.runs.Run.nothing",
    ]
    block = "a `runs.Run`\n```python\nimport x\nruns.Nothing()\n```\n`x.y`"
    assert markdown_code(block) == [(1, "runs.Run"), (3, "import x\nruns.Nothing()\n"), (6, "x.y")]
    assert unresolved([("block.md", line, code, frozenset()) for line, code in markdown_code(block)], attributes) == [
        "block.md:4: runs.Nothing"
    ]
