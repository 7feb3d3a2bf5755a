"""Turning a :class:`Dataset` into the stream the engine consumes, and the held-out test tensors.

Both take an optional ``input_shape``: the model's per-sample input. When it differs from the dataset's
(a model built and profiled for 224×224 images on a 32×32 dataset), every image is resized to it with
bilinear interpolation (``torch.nn.functional.interpolate``, ``align_corners=False``, no antialiasing),
so the run sees the shapes its plan was priced for. Channels must match: a resize never
invents or drops channels.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ferret_core.data.dataset import Dataset, normalise
from ferret_core.errors import ConfigError


@dataclass(frozen=True, eq=False)
class StreamItem:
    """One arrival: its position ``index`` in the stream (0-based), sample, label and task id."""

    index: int
    x: torch.Tensor  # float32, per-sample shape == Dataset.input_shape, values in [0, 1]
    y: int
    task: int


def stream_order(ds: Dataset, *, iid: bool = False, seed: int = 0) -> np.ndarray:
    """Row indices of ``ds.x_train`` in stream order: stored order, or a seeded shuffle when ``iid``."""
    n = len(ds.y_train)
    if iid:
        return np.random.default_rng(seed).permutation(n)
    return np.arange(n)


RESIZE_METHOD = "bilinear"


def needs_resize(ds: Dataset, input_shape: tuple[int, ...] | None) -> bool:
    """Whether samples of ``ds`` must be resized to ``input_shape`` (raises if no resize can match)."""
    if input_shape is None or tuple(input_shape) == tuple(ds.input_shape):
        return False
    have, want = tuple(ds.input_shape), tuple(input_shape)
    if len(have) != 3 or len(want) != 3 or have[0] != want[0]:
        if math.prod(have) == math.prod(want) and len(want) == 1:
            return False  # a flat model input of the same size: the engine flattens, nothing to resize
        raise ConfigError(
            f"dataset {ds.name!r} has samples of shape {list(have)}, the model takes {list(want)}: only images "
            f"with the same number of channels can be resized; build the model for the dataset's input"
        )
    return True


def resize_images(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``(C, H, W)`` or ``(N, C, H, W)`` images resized to ``size`` = (H', W') by bilinear interpolation."""
    batch = x if x.dim() == 4 else x.unsqueeze(0)
    out = F.interpolate(batch, size=size, mode=RESIZE_METHOD, align_corners=False, antialias=False)
    return out if x.dim() == 4 else out[0]


def task_balanced_order(ds: Dataset, limit: int) -> np.ndarray:
    """Row indices of a ``limit``-item stream that keeps every task of a task-ordered stream (``split-*``):
    the first ⌊limit/T⌋ items of each task in stream order (the first ``limit mod T`` tasks one more), so a
    short stream is still T tasks long."""
    tasks = ds.tasks_train
    if tasks is None or ds.num_tasks == 1:
        return np.arange(min(limit, len(ds.y_train)))
    count = ds.num_tasks
    share = [limit // count + (1 if t < limit % count else 0) for t in range(count)]
    return np.concatenate([np.flatnonzero(tasks == t)[: share[t]] for t in range(count)])


def iter_stream(
    ds: Dataset,
    *,
    limit: int | None = None,
    iid: bool = False,
    seed: int = 0,
    input_shape: tuple[int, ...] | None = None,
    per_task: bool = False,
) -> Iterator[StreamItem]:
    """The training split as a stream of :class:`StreamItem`, one sample at a time.

    The stored order is the stream order (task by task for ``split-*`` datasets); ``iid=True`` shuffles
    it with ``seed`` (tasks stay attached to their samples). ``limit`` stops after that many items, or,
    with ``per_task`` on a task-ordered stream, takes them from every task (:func:`task_balanced_order`).
    ``x`` is float32 in ``[0, 1]`` (see :func:`ferret_core.data.dataset.normalise`), resized to
    ``input_shape`` when given and different (see the module docstring); ``task`` is 0 when the dataset
    has no task structure.
    """
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be None or >= 0, got {limit}")
    resize = needs_resize(ds, input_shape)
    size = (int(input_shape[1]), int(input_shape[2])) if resize and input_shape is not None else (0, 0)
    if per_task and limit is not None and not iid:
        order = task_balanced_order(ds, limit)
    else:
        order = stream_order(ds, iid=iid, seed=seed)
        if limit is not None:
            order = order[:limit]
    tasks = ds.tasks_train
    for index, row in enumerate(order.tolist()):
        x = normalise(ds.x_train[row])
        yield StreamItem(
            index=index,
            x=resize_images(x, size) if resize else x,
            y=int(ds.y_train[row]),
            task=0 if tasks is None else int(tasks[row]),
        )


def test_split(ds: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out split as ``(x, y)``: float32 ``(N, *input_shape)`` in ``[0, 1]`` and int64 ``(N,)``."""
    return normalise(ds.x_test), torch.from_numpy(ds.y_test.copy())


def test_batches(
    ds: Dataset, input_shape: tuple[int, ...] | None = None, *, batch: int = 500
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The held-out split in batches ``(x, y)``, resized like the stream (a resized split may not fit in
    memory at once: CIFAR-10's test split at 224×224 is 6 GB)."""
    resize = needs_resize(ds, input_shape)
    size = (int(input_shape[1]), int(input_shape[2])) if resize and input_shape is not None else (0, 0)
    for start in range(0, len(ds.y_test), batch):
        x = normalise(ds.x_test[start : start + batch])
        yield (resize_images(x, size) if resize else x), torch.from_numpy(ds.y_test[start : start + batch].copy())


test_split.__test__ = False  # type: ignore[attr-defined]  # a library function, not a pytest test
test_batches.__test__ = False  # type: ignore[attr-defined]
