"""How the datasets are split, as the authors' released code splits them (``docs/fidelity.md``).

- ``deterministic_split``: the fixed 80/20 train/test split of the datasets without an official
  test set (Cifar10-C, DomainNet; appendix C.2): the authors' numpy permutation under seed 42.
- ``validation_split``: the finetuning protocol's validation set, 20% of a training set drawn from
  the run's seed, as the authors' ``random_split`` draws it (§5.2), in the order their loader reads it.
- ``hash_split``: a split by each item's key, for the demo world's digits and ``custom/<name>``
  folders without a test folder.

``datasets.get_dataset`` applies them; none reads or changes global random state.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import torch

TRAIN_FRACTION = 0.8  # the training share of every 80/20 split (the authors' ``train_size``)
SPLIT_SEED = 42  # the authors' fixed seed of the train/test split of datasets without an official one


def _cut(order: np.ndarray, train_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The first ``int(train_fraction * n)`` positions of a permutation for training, the rest held out; in order."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
    n_train = int(train_fraction * len(order))
    return order[:n_train], order[n_train:]


def deterministic_split(
    n: int, train_fraction: float = TRAIN_FRACTION, seed: int = SPLIT_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) positions of ``n`` images without an official test set.

    Such sets are Cifar10-C and DomainNet (appendix C.2). The positions are drawn as the authors'
    code draws them: one numpy permutation of ``0..n-1`` from ``seed`` (42, whatever the run's
    seed), its first ``int(train_fraction * n)`` positions for training and the rest for test, both
    sorted (images keep their order in the files). A ``RandomState`` of its own draws it: global
    random state is neither read nor changed."""
    train, test = _cut(np.random.RandomState(seed).permutation(n), train_fraction)
    return np.sort(train), np.sort(test)


def validation_split(n: int, seed: int, train_fraction: float = TRAIN_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) positions of a training set of ``n`` images for the run of ``seed``.

    Drawn as the authors' code draws them: ``torch.randperm(n)`` from a generator seeded with ``seed`` (the draw
    of ``torch.utils.data.random_split`` after ``torch.manual_seed(seed)``), its first
    ``int(train_fraction * n)`` positions for training, sorted, and the rest for validation in the permutation's
    order: the order in which their validation loader (``shuffle=False``) reads the ``Subset`` that ``random_split``
    returns, so that each validation batch holds the images theirs holds (``readings.accuracy``: the last partial
    batch weighs as a whole one)."""
    train, val = _cut(torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy(), train_fraction)
    return np.sort(train), val


def hash_split(keys: Sequence, test_fraction: float = 0.2, salt: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(train, test) positions of ``keys`` by hashing each key.

    The keys are ordered by the SHA-256 of ``f"{salt}:{key}"`` and the first ``round(test_fraction * n)`` go
    to test; both sorted. The demo world's digits (the split the committed demo ViT was trained on) and
    ``custom/<name>`` folders without a test folder (an image stays on its side when others are added) use
    it."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    digests = [hashlib.sha256(f"{salt}:{key}".encode()).hexdigest() for key in keys]
    order = np.argsort(np.array(digests), kind="stable")
    n_test = int(round(test_fraction * len(keys)))
    return np.sort(order[n_test:]), np.sort(order[:n_test])
