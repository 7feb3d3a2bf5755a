"""Covertype (UCI, Blackard 1998): 581,012 rows, 54 features, 7 cover types.

Layout: ``<root>/covtype.data.gz`` or ``<root>/covtype.data`` (also under ``<root>/covertype/``), the
UCI CSV with 54 integer feature columns and the class (1…7) last; classes are mapped to 0…6.

Split (documented choice; the paper gives none): a seeded random 80/20 train/test split of all rows,
the training rows in that random order. Features are min-max scaled to ``[0, 1]`` with the training
split's minimum and maximum and stored as float32 ``(N, 54)`` (test values may fall slightly outside).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from ferret_core.data.dataset import Dataset, holdout_indices
from ferret_core.errors import DataError

NUM_FEATURES = 54
NUM_CLASSES = 7
TEST_FRACTION = 0.2


def _find(root: Path) -> Path:
    candidates = [
        folder / name for folder in (root, root / "covertype") for name in ("covtype.data.gz", "covtype.data")
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise DataError(f"Covertype not found: expected one of {[str(p) for p in candidates]} (data root {root})")


def read_covtype(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Features ``int64 (N, 54)`` and labels ``int64`` 0…6 from the UCI CSV (gzip or plain)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt") as handle:
                table = np.loadtxt(handle, delimiter=",", dtype=np.int64, ndmin=2)
        else:
            table = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not the Covertype CSV (55 integer columns): {exc}") from exc
    if table.shape[1] != NUM_FEATURES + 1:
        raise DataError(f"{path}: expected {NUM_FEATURES + 1} columns, got {table.shape[1]}")
    labels = table[:, -1] - 1
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{path}: class column must lie in 1…{NUM_CLASSES}, got {labels.min() + 1}…{labels.max() + 1}")
    return table[:, :NUM_FEATURES], labels


def load_covertype(root: Path, *, seed: int = 0) -> Dataset:
    """Covertype as float32 ``(N, 54)`` in ``[0, 1]`` (train statistics), seeded 80/20 split."""
    features, labels = read_covtype(_find(root))
    train, test = holdout_indices(len(labels), TEST_FRACTION, seed)
    x_tr = features[train].astype(np.float64)
    lo = x_tr.min(axis=0) if len(train) else np.zeros(NUM_FEATURES)
    span = np.maximum((x_tr.max(axis=0) if len(train) else np.ones(NUM_FEATURES)) - lo, 1.0)

    def scale(x: np.ndarray) -> np.ndarray:
        return ((x.astype(np.float64) - lo) / span).astype(np.float32)

    return Dataset(
        "covertype",
        scale(features[train]),
        labels[train],
        scale(features[test]),
        labels[test],
        num_classes=NUM_CLASSES,
        input_shape=(NUM_FEATURES,),
    )
