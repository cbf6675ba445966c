"""CPU threads for processes of ours that share a machine: their sum no more than its cores.

PyTorch's OpenMP threads wait for one another by spinning, so two processes with a thread per core each on the same
cores do not share them: each barrier waits for a thread the other process holds, and a run beside a second one takes
many times as long as alone (figures: ``docs/benchmarks.md``). So the sweep's executors that start several workers on
one machine (``gpus``: one per GPU, ``submitit-local``: one per run) tell them how many they are
(``VIT_PLASTICITY_WORKERS``, inherited by the notebooks' kernels), and each run sets its threads to its share of the
cores (``apply``; set the variable yourself for two notebooks at once). Alone, a run keeps PyTorch's own choice, which
the recorded demo results were computed with: on a CPU the thread count changes a run's last digits (reductions split
otherwise), so a run records it (``threads`` in its metrics). ``paperlib/__init__.py`` also makes waiting threads sleep
(``OMP_WAIT_POLICY=PASSIVE``, unless set): whatever else shares the cores, nothing spins.
"""

from __future__ import annotations

import contextlib
import os

import torch

WORKERS = "VIT_PLASTICITY_WORKERS"
"""How many processes of ours share this machine's cores (default 1)."""


def cores() -> int:
    """The CPU cores this process may run on (its affinity, as SLURM or ``taskset`` sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity
        return os.cpu_count() or 1


def workers() -> int:
    """``VIT_PLASTICITY_WORKERS``: how many processes of ours share the cores (1 when unset)."""
    value = os.environ.get(WORKERS, "").strip() or "1"
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{WORKERS} must be a positive integer (processes sharing the cores), got {value!r}")
    return int(value)


def budget() -> int | None:
    """Threads for one of ``workers()`` processes.

    Its share of the cores, at least 1; None for a process alone (PyTorch's own choice stands)."""
    count = workers()
    return None if count == 1 else max(1, cores() // count)


def apply() -> int:
    """Set PyTorch's threads to ``budget()`` (if any); returns the threads this process computes with."""
    threads = budget()
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()


@contextlib.contextmanager
def shared_by(count: int):
    """Tell processes started in the block that ``count`` of them share the cores.

    While the block runs, processes started from this one are told that ``count`` of them share the
    cores (``VIT_PLASTICITY_WORKERS``); the variable is restored after."""
    previous = os.environ.get(WORKERS)
    os.environ[WORKERS] = str(max(1, count))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(WORKERS, None)
        else:
            os.environ[WORKERS] = previous
