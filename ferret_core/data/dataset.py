"""The in-memory dataset every loader returns, and the one normalisation step applied at iteration.

Storage convention (chosen to keep big image sets small in memory):

* images are ``uint8`` arrays in channels-first layout ``(N, C, H, W)``, exactly as decoded; they are
  divided by 255 into float32 ``[0, 1]`` when a sample is taken out (:func:`normalise`);
* non-image or already-scaled features (``digits``, ``covertype``) are ``float32`` arrays, already in
  ``[0, 1]`` (``covertype``: min-max scaled with the training split's statistics), passed through as is.

Labels are ``int64`` class indices ``0 … num_classes−1``; ``tasks_*`` (``int64`` task ids ``0 …``) are set
for streams with task structure (``split-*``, CLEAR's time buckets) and ``None`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ferret_core.errors import DataError


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test pair of arrays with its metadata; rows of ``x_train`` are the stream's items."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    tasks_train: np.ndarray | None = None
    tasks_test: np.ndarray | None = None

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            tasks = getattr(self, f"tasks_{split}")
            if x.dtype not in (np.uint8, np.float32):
                raise DataError(f"{self.name}: x_{split} must be uint8 or float32, got {x.dtype}")
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise DataError(f"{self.name}: x_{split} samples must have shape {self.input_shape}, got {x.shape[1:]}")
            if y.dtype != np.int64 or y.shape != (x.shape[0],):
                raise DataError(
                    f"{self.name}: y_{split} must be int64 of shape ({x.shape[0]},), got {y.dtype} {y.shape}"
                )
            if y.size and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise DataError(
                    f"{self.name}: y_{split} must lie in [0, {self.num_classes}), got [{int(y.min())}, {int(y.max())}]"
                )
            if tasks is not None and (tasks.dtype != np.int64 or tasks.shape != y.shape):
                raise DataError(
                    f"{self.name}: tasks_{split} must be int64 of shape {y.shape}, got {tasks.dtype} {tasks.shape}"
                )

    @property
    def num_tasks(self) -> int:
        """Number of tasks in the training stream (1 when the stream has no task structure)."""
        if self.tasks_train is None or self.tasks_train.size == 0:
            return 1
        return int(self.tasks_train.max()) + 1

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, train={len(self.y_train)}, test={len(self.y_test)}, "
            f"classes={self.num_classes}, input_shape={self.input_shape}, dtype={self.x_train.dtype}, "
            f"tasks={self.num_tasks})"
        )


def normalise(x: np.ndarray) -> torch.Tensor:
    """Samples as float32 in ``[0, 1]``: ``uint8`` is divided by 255, ``float32`` is passed through."""
    if x.dtype == np.uint8:
        return torch.from_numpy(x).to(torch.float32).div_(255.0)
    if x.dtype == np.float32:
        return torch.from_numpy(x.copy())
    raise DataError(f"cannot normalise samples of dtype {x.dtype}: expected uint8 or float32")


def permute(ds: Dataset, seed: int, *, test: bool = True) -> Dataset:
    """The same dataset with its training (and test) rows in a fixed pseudo-random order."""
    rng = np.random.default_rng(seed)
    tr = rng.permutation(len(ds.y_train))
    te = rng.permutation(len(ds.y_test)) if test else np.arange(len(ds.y_test))
    return Dataset(
        name=ds.name,
        x_train=ds.x_train[tr],
        y_train=ds.y_train[tr],
        x_test=ds.x_test[te],
        y_test=ds.y_test[te],
        num_classes=ds.num_classes,
        input_shape=ds.input_shape,
        tasks_train=None if ds.tasks_train is None else ds.tasks_train[tr],
        tasks_test=None if ds.tasks_test is None else ds.tasks_test[te],
    )


def holdout_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded train/test split of ``range(n)``: (train indices, test indices), each in random order."""
    order = np.random.default_rng(seed).permutation(n)
    n_test = round(n * test_fraction)
    return order[n_test:], order[:n_test]
