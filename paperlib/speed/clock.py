"""What a step is timed with: the device it runs on, and a clock that waits for it.

The device: ``resolve_device``, ``device_name``; the clock: ``sync``, ``median_seconds``, ``Timed``. Used by the
sweep's cost estimate (``paperlib.sweeps.plan``) and by the benchmarks (``benchmarks.step``, ``benchmarks.data``).
"""

from __future__ import annotations

import platform
import statistics
import time

import torch


def resolve_device(device: str) -> torch.device:
    """The device a benchmark runs on: ``device``, with "auto" CUDA when there is a GPU, else the CPU."""
    return torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    )


def device_name(device: torch.device) -> str:
    """What ran, for the figures: the GPU's name, or the CPU and its threads."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a GPU runs asynchronously to the host)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(runs: dict, device: torch.device, repeats: int = 1) -> dict[str, float]:
    """Median wall seconds of each ``runs[name] = (run, warmup)``, device synchronised.

    Every warm-up (allocations, kernels, compilation) runs first; then the runs are timed in
    turn, ``repeats`` rounds, so that a slow spell of a shared machine falls on all of them.
    """
    for _, warmup in runs.values():
        warmup()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (run, _) in runs.items():
            sync(device)
            start = time.perf_counter()
            run()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


class Timed:
    """A callable that runs ``run`` and keeps its wall seconds and its return value.

    The wall seconds (device synchronised) are in ``seconds``, the return value in ``value``."""

    def __init__(self, run, device: torch.device):
        self.run, self.device, self.seconds, self.value = run, device, float("nan"), None

    def __call__(self):
        sync(self.device)
        start = time.perf_counter()
        self.value = self.run()
        sync(self.device)
        self.seconds = time.perf_counter() - start
        return self.value


def endless(loader):
    """The batches of ``loader``, epoch after epoch."""
    while True:
        yield from loader
