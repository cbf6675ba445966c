"""How the package writes and reads its files safely: atomic writes, checked reads, locks.

A file is written to a temporary name and renamed into place (``atomic_write``), so that an interrupted
run or sweep leaves the old file or the new one, never half of one; a disk that refuses a file says why
in one line (``CannotWrite``); what one process at a time may write is held by a lock (``locked``).
A result's files are written with their checksum (``write_checked``), which the record written after them
holds (``write_json``: a JSON record carries its own too), and are checked when read (``read_checked``,
``read_json``): a damaged file is named, never read as a result. Where things live is ``paths``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable

from paperlib.records.paths import display


class CannotWrite(OSError):
    """The disk refused a file: a read-only folder, no permission, or no space left.

    The message says which folder or file and why; command lines report it in one line (``cli.BAD_INPUT``)."""


FULL_DISK = (
    64 * 2**20
)  # bytes free below which a failed write is taken for a full disk (torch.save says only "unexpected pos")


def unwritable(path: str | Path, error: BaseException, folder: str | Path | None = None) -> BaseException:
    """``error``, raised while writing ``path``, as a ``CannotWrite`` when the disk refused it.

    The ``CannotWrite`` says why: read-only or no permission (as the error's number says, whatever the disk's free
    space), no space left, or a write that failed on a disk with less than ``FULL_DISK`` free. Any other error as
    it is. ``folder``: the folder to name (default:
    ``path``'s)."""
    path = Path(path)
    folder = Path(folder) if folder is not None else path.parent
    number = getattr(error, "errno", None)
    if number in (errno.EROFS, errno.EACCES, errno.EPERM):  # said by the disk: before any guess from its free space
        return CannotWrite(f"cannot write in {display(folder)}: {os.strerror(number).lower()}")
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    try:
        full = existing is not None and shutil.disk_usage(existing).free < FULL_DISK
    except OSError:
        full = False
    if number in (errno.ENOSPC, errno.EDQUOT) or (full and isinstance(error, (OSError, RuntimeError))):
        return CannotWrite(f"no space left on the device of {display(existing or folder)}: cannot write {path.name}")
    return error


def make_folder(folder: str | Path) -> Path:
    """``folder`` and its parents, made if missing; a ``CannotWrite`` that says why if the disk refuses."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise unwritable(folder, error, folder) from error
    return folder


def atomic_write(path: str | Path, write: Callable[[str], None]) -> Path:
    """Write ``path`` through ``write(temporary_path)`` and rename: readers never see half a file.

    A read-only folder or a full disk is a ``CannotWrite`` that names it (``unwritable``)."""
    path = Path(path)
    make_folder(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise unwritable(path, error) from error
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp's files are private (0600); a written file is not
        os.replace(tmp, path)
    except (OSError, RuntimeError) as error:
        raise unwritable(path, error) from error
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write a text file atomically (UTF-8)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(path: str | Path, payload: dict) -> Path:
    """``payload`` as indented JSON, atomically, with the checksum of its content: what ``read_json`` reads back.

    The checksum (``sha256``: ``_digest``) is of the payload as it reads back, so that a value changed since is
    found."""
    payload = {key: value for key, value in json.loads(json.dumps(payload, default=str)).items() if key != "sha256"}
    return atomic_write_text(path, json.dumps(payload | {"sha256": _digest(payload)}, indent=2) + "\n")


def _digest(payload: dict) -> str:
    """The SHA-256 of a JSON record's content (its keys sorted), whatever its layout on disk."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def atomic_folder(folder: str | Path, fill: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Make ``folder`` through ``fill(staging_folder)`` and a rename: whole or not at all.

    An existing ``folder`` is an error unless ``overwrite``; then it is moved aside before the new
    one takes its place and deleted after, so one of the two is always whole on disk.
    """
    folder = Path(folder)
    if folder.exists() and not overwrite:
        raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folders are private (0700); a saved model or dataset is not
        fill(staging)
        if folder.exists():
            aside = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old."))
            os.replace(folder, aside / folder.name)
            os.replace(staging, folder)
            shutil.rmtree(aside)
        else:
            os.replace(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def write_checked(path: str | Path, write: Callable[[str], None]) -> dict:
    """Write ``path`` as ``atomic_write`` does; returns what a record keeps of the bytes written.

    That is ``{"bytes": size, "sha256": checksum}``, of the temporary file before its rename. The JSON record
    written after the file holds it under ``files`` (``{name: ...}``), so that ``read_checked`` and ``read_json``
    find a file cut short or changed since."""
    kept = {}

    def written(tmp: str) -> None:
        write(tmp)
        kept.update(kept_of(tmp))

    atomic_write(path, written)
    return kept


def size_of(path: str | Path) -> int | None:
    """The size of the file ``path`` in bytes; None if there is none."""
    return os.path.getsize(path) if os.path.isfile(path) else None


def kept_of(path: str | Path) -> dict:
    """What a record keeps of a file already written (``write_checked``'s): its size and checksum."""
    return {"bytes": os.path.getsize(path), "sha256": _sha256(path)}


def _check(record: Path, name: str, kept, whole: bool = True) -> None:
    """A ValueError naming the file ``name`` beside ``record`` unless it is the one ``record`` keeps.

    ``kept``: ``write_checked``'s, or a size alone (an int: a record written before checksums, which ``whole`` refuses).
    ``whole``: its checksum compared too, else its size alone."""
    file = record.parent / name
    size = kept if isinstance(kept, int) else (kept or {}).get("bytes")
    problem = None
    if size is None:
        problem = "not recorded"
    elif not file.is_file():
        problem = "missing"
    elif file.stat().st_size != size:
        problem = f"{file.stat().st_size} bytes, not {size}"
    elif whole and isinstance(kept, int):
        raise ValueError(f"{record.name} records no checksum of {display(file)}: written by an earlier version")
    elif whole and _sha256(file) != kept.get("sha256"):
        problem = "its bytes changed since"
    if problem:
        raise ValueError(f"{display(file)} is not the file {record.name} records ({problem}; damaged?)")


def _sha256(file: str | Path) -> str:
    with open(file, "rb") as opened:
        return hashlib.file_digest(opened, "sha256").hexdigest()


def read_json(path: str | Path, whole: bool = False, checksum: bool | Callable[[dict], bool] | None = None) -> dict:
    """A JSON object that a run or result writes (``write_json``), checked.

    Those are a run's ``params.json`` and ``metrics.json``, a result's ``metadata.json``, a sweep's marker. A
    FileNotFoundError if it is missing; a ValueError naming the file if it is not a whole JSON object, or not the one
    written (its ``sha256``), or if a file it records (``files``: ``write_checked``) is missing or of another size
    since. ``checksum``: whether it must carry its ``sha256`` (a record written before checksums has none), or a
    function of its content that says so (a record that says which version wrote it: ``runs.versions``); None, it must
    if it holds the checksums of its files (every record since checksums has). A record that must and does not is
    damaged. ``whole``: the checksums of the files it records compared too (each read whole; ``read_checked`` reads
    one)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{display(path)} not found")
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{display(path)} is not whole JSON (damaged?)") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{display(path)} holds no JSON object (damaged?)")
    content = {key: value for key, value in payload.items() if key != "sha256"}
    files = content.get("files", {})
    if not isinstance(files, dict):
        raise ValueError(f"{display(path)} holds no table of its files (damaged?)")
    if checksum is None:
        checksum = any(isinstance(kept, dict) for kept in files.values())
    if "sha256" not in payload and (checksum(content) if callable(checksum) else checksum):
        raise ValueError(f"{display(path)} carries no checksum (sha256), as every record of its version does: damaged")
    if "sha256" in payload and payload["sha256"] != _digest(content):
        raise ValueError(f"{display(path)} is not the record written: its content changed since (damaged?)")
    for name, kept in files.items():  # a record of no other files (params.json): none to check
        _check(path, name, kept, whole)
    return content


def read_checked(record: str | Path, name: str) -> bytes:
    """The bytes of the file ``name`` beside the JSON ``record`` that holds its checksum, checked against it.

    ``record``: a run's ``metrics.json``, a result's ``metadata.json``. A ValueError naming the file if it is not the
    one written (or ``read_json``'s, for the record): a damaged file is never read as a result. A record written before
    checksums holds the file's size alone: that is what is checked (a result of an older version, read as it is)."""
    record = Path(record)
    kept = read_json(record).get("files", {}).get(name)
    _check(record, name, kept, whole=not isinstance(kept, int))
    return (record.parent / name).read_bytes()


def json_or_none(
    path: str | Path, whole: bool = False, checksum: bool | Callable[[dict], bool] | None = None
) -> dict | None:
    """``read_json(path, whole, checksum)``, or None if the file is missing or damaged.

    What is damaged is reported in a warning that names the file, and never taken for a result (it is made again)."""
    try:
        return read_json(path, whole, checksum)
    except FileNotFoundError:
        return None
    except ValueError as error:
        warnings.warn(str(error), stacklevel=2)
        return None


def notice(message: str) -> None:
    """Say ``message`` on the terminal this process was started from (its stderr).

    ``message``: a note on what this process does or waits for, not a result. In a Jupyter kernel, stderr is the
    running cell's output, and ipykernel sends the kernel's file descriptor 2 there too; the note goes instead to the
    copy of the kernel's own stderr that ipykernel keeps (``sys.stderr.fileno()``): the terminal of ``make demo`` or of
    ``jupyter lab``, never an executed notebook or its report."""
    iostream = sys.modules.get("ipykernel.iostream")
    if iostream is None or not isinstance(sys.stderr, iostream.OutStream):  # a command line
        print(message, file=sys.stderr, flush=True)
        return
    try:
        terminal = sys.stderr.fileno()
    except io.UnsupportedOperation:  # a kernel that left descriptor 2 as it was (under pytest): the terminal
        terminal = sys.__stderr__.fileno()
    os.write(terminal, f"{message}\n".encode())


class Busy(RuntimeError):
    """Another process holds the lock of what this one was asked to write (``locked(..., wait=False)``)."""


_HELD: set[Path] = set()  # what this process holds locked: locking it again inside does not wait for itself


@contextlib.contextmanager
def locked(path: str | Path, wait: bool = True):
    """Hold the exclusive lock of ``path`` while the block runs.

    ``path`` is what one process at a time may write: a run folder, a cache file, a result folder. The
    lock is an OS file lock (``fcntl.flock``) on ``.<name>.lock`` beside ``path``, which the OS releases
    when its process ends, however it ends (``kill -9`` too): no stale lock is ever left. A process that
    finds it held says so once on the terminal (``notice``) and waits for it (``wait=False``: raises
    ``Busy`` instead); the caller then checks whether the holder finished the work. Locking what this
    process already holds does not wait."""
    path = Path(path).absolute()
    if path in _HELD:
        yield
        return
    lock = make_folder(path.parent) / f".{path.name}.lock"
    try:
        handle = open(lock, "a")
    except OSError as error:
        raise unwritable(lock, error) from error
    with handle:  # closing it (here, or by the process's end) releases the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise Busy(f"{display(path)} is being written by another process (running elsewhere)") from None
            notice(f"waiting for another process that is writing {display(path)}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD.add(path)
        try:
            yield
        finally:
            _HELD.discard(path)
