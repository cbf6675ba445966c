"""``python -m paperlib <command>``: every command of the package, one entry point.

``python -m paperlib --help`` lists them; ``python -m paperlib <command> --help`` gives a command's options. A command's
module is imported only when it runs, so that ``stats`` and ``precision`` load no training stack; each command line is
parsed first (``records.commands``), so that ``--help`` and a mistyped option answer before the module is imported.
"""

from __future__ import annotations

import importlib
import sys
import warnings

from paperlib import COMMANDS  # in the package's __init__, which answers python -m paperlib.<command> too
from paperlib.records import commands


def usage() -> str:
    """The list of commands that ``--help`` prints."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return (
        "usage: python -m paperlib <command> [options]\n\ncommands:\n"
        + "\n".join(lines)
        + ("\n\n`python -m paperlib <command> --help` lists a command's options.")
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names with the rest of ``argv``; 2, with the valid commands, for an unknown one.

    Ctrl-C ends a command with one line (``INTERRUPTED``) and exit status 130, not a traceback."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        given = f"unknown command {argv[0]!r}" if argv else "no command"
        print(f"python -m paperlib: {given}; valid commands: {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    commands.PARSERS[argv[0]]().parse_args(argv[1:])  # --help and a bad option stop here, before torch is imported
    warnings.formatwarning = one_line
    try:
        module = importlib.import_module(COMMANDS[argv[0]][0])
        return module.main(argv[1:]) or 0
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130


INTERRUPTED = (
    "interrupted: run the same command again to resume "
    "(a finetuning run resumes from its last checkpoint; a sweep skips its finished runs)"
)
"""What a command interrupted by Ctrl-C prints, in place of a traceback; it then exits with status 130 (128 + SIGINT,
as a shell reports a process that SIGINT ended)."""


def one_line(message, category, *where) -> str:
    """A warning as a command prints it: ``warning: ...``, one line (what it names, not our line that said it)."""
    return f"warning: {message}\n"


if __name__ == "__main__":
    sys.exit(main())
