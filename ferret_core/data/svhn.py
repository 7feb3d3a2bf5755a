"""SVHN (cropped digits, format 2) from the official MATLAB files.

Layout (as downloaded from ufldl.stanford.edu/housenumbers, and as torchvision stores them)::

    <root>/SVHN/{train,test}_32x32.mat   or   <root>/{train,test}_32x32.mat

Each file holds ``X`` uint8 ``(32, 32, 3, N)`` and ``y`` ``(N, 1)`` with the digit 0 labelled 10; labels
are mapped to 0…9. The ``extra`` split is not used. Samples keep the published order; scipy is imported
lazily.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ferret_core.data.dataset import Dataset
from ferret_core.errors import DataError


def _find(root: Path, split: str) -> Path:
    candidates = [root / "SVHN" / f"{split}_32x32.mat", root / f"{split}_32x32.mat"]
    for path in candidates:
        if path.is_file():
            return path
    raise DataError(f"SVHN not found: expected {' or '.join(map(str, candidates))} under the data root {root}")


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import scipy.io

    try:
        mat: dict[str, Any] = scipy.io.loadmat(str(path))
        x = np.asarray(mat["X"], dtype=np.uint8)
        y = np.asarray(mat["y"], dtype=np.int64).reshape(-1)
    except (KeyError, ValueError, OSError, NotImplementedError) as exc:
        raise DataError(f"{path}: not an SVHN .mat file with X (32, 32, 3, N) and y (N, 1): {exc}") from exc
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != y.shape[0]:
        raise DataError(f"{path}: expected X (32, 32, 3, N) and N labels, got {x.shape} and {y.shape}")
    y = np.where(y == 10, 0, y)
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y


def load_svhn(root: Path) -> Dataset:
    """SVHN train/test as ``uint8 (N, 3, 32, 32)``, labels 0…9."""
    x_tr, y_tr = _read(_find(root, "train"))
    x_te, y_te = _read(_find(root, "test"))
    return Dataset("svhn", x_tr, y_tr, x_te, y_te, num_classes=10, input_shape=(3, 32, 32))
