"""A probe table on disk: ``probe.csv`` (one row per block and point) and its ``metadata.json``, without torch.

What ``measure.probe.linear_probe`` writes as it fits and reads back (``cached``: the rows of a ``Probe.key()``); the
probe points (``POINTS``) name its rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from paperlib.records import storage

POINTS = ("ln1", "mha", "attn_residual", "ln2", "fc1", "gelu", "fc2", "block")
"""Probe points of a block, in the order of its forward pass: the output of each component (``ln1``,
``mha``, ``ln2``, ``fc1``, ``fc2``), of the activation (``gelu``), and the residual stream after
attention (``attn_residual``: the input of ``norm2``) and after the block (``block``). ``mha`` is the
attention module's output, before the residual addition and before LayerScale where a block has one
(the paper's ViTs have none); ``gelu`` is the output of ``mlp.act`` (in a SwiGLU block, the gate's
activation); ``fc1`` of a SwiGLU block with separate gate and value layers is the two side by side.
"""


def load(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    """The cached table (``probe.csv``) and ``metadata.json`` of a result folder.

    Empty if none, or if damaged (``storage.json_or_none`` checks the table's checksum and warns, and the probes are
    fitted again)."""
    metadata = storage.json_or_none(Path(folder) / "metadata.json", whole=True)
    return (empty(), {}) if metadata is None else (pd.read_csv(Path(folder) / "probe.csv"), metadata)


def empty() -> pd.DataFrame:
    """A probe table without rows."""
    return pd.DataFrame(
        {"block": pd.Series(dtype=int), "point": pd.Series(dtype=str), "accuracy": pd.Series(dtype=float)}
    )


def save(table: pd.DataFrame, folder: str | Path, metadata: dict) -> Path:
    """Write ``probe.csv`` then ``metadata.json`` into ``folder``, each atomically.

    The metadata, written last with the table's size and checksum (``files``), says the table is whole."""
    folder = Path(folder)
    written = storage.write_checked(folder / "probe.csv", lambda tmp: table.to_csv(tmp, index=False))
    storage.write_json(folder / "metadata.json", metadata | {"files": {"probe.csv": written}})
    return folder


def tidy(table: pd.DataFrame, wanted: Sequence[tuple[int, str]]) -> pd.DataFrame:
    """The rows of ``wanted`` in block then point order, ``point`` an ordered categorical."""
    rows = table.set_index(["block", "point"]).loc[list(wanted)].reset_index()
    rows["block"] = rows["block"].astype(int)
    rows["accuracy"] = rows["accuracy"].astype(float)
    rows["point"] = pd.Categorical(rows["point"], categories=POINTS, ordered=True)
    return rows[["block", "point", "accuracy"]].reset_index(drop=True)


def cached(folder: Path | None, key: dict, wanted: list) -> tuple[pd.DataFrame, dict, list]:
    """The probe table and metadata cached in ``folder``, and the (block, point) not in it.

    The cache counts only if it is of this ``key`` (empty otherwise); the (block, point) are those
    of ``wanted``."""
    table, metadata = load(folder) if folder is not None else (empty(), {})
    if metadata.get("key") != key:  # another model or dataset under the name (custom ones change): not this
        table, metadata = empty(), {}
    done = set(zip(table["block"].astype(int), table["point"]))
    return table, metadata, [item for item in wanted if item not in done]
