"""The devices a run or a measurement may name (``cpu``, ``cuda``, ``cuda:<index>``), and those this machine has."""

from __future__ import annotations

import contextlib

DEVICE_TYPES = ("cpu", "cuda")


def devices_here() -> list[str]:
    """The devices this machine has: ``cpu``, and ``cuda`` (``cuda:0``, ...) for its GPUs."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(count)] if count else [])


def check_device(device, here: bool = True):
    """``device`` as a ``torch.device``, or a ValueError naming the valid ones.

    A device's name (``cpu``, ``cuda``, ``cuda:<i>``), and with ``here``, one this machine has
    (``devices_here``)."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        parsed = None
    if parsed is None or parsed.type not in DEVICE_TYPES:
        raise ValueError(
            f"unknown device {device!r}; valid devices: cpu, cuda, cuda:<index> (here: {', '.join(devices_here())})"
        )
    if here and parsed.type == "cuda" and str(parsed) not in devices_here():
        raise ValueError(f"device {device!r} is not on this machine; devices here: {', '.join(devices_here())}")
    return parsed


@contextlib.contextmanager
def deterministic(device):
    """PyTorch's deterministic algorithms while the block runs on ``device``; the caller's setting restored after.

    ``device`` is checked first (``check_device``). On a CPU always deterministic; on CUDA as the caller set PyTorch
    (its deterministic mode there also needs ``CUBLAS_WORKSPACE_CONFIG``)."""
    import torch

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(check_device(device).type != "cuda" or previous)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)
