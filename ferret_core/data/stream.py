"""Turning a :class:`Dataset` into the stream the engine consumes, and the held-out test tensors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

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
    ds: Dataset, *, limit: int | None = None, iid: bool = False, seed: int = 0, per_task: bool = False
) -> Iterator[StreamItem]:
    """The training split as a stream of :class:`StreamItem`, one sample at a time.

    The stored order is the stream order (task by task for ``split-*`` datasets); ``iid=True`` shuffles
    it with ``seed`` (tasks stay attached to their samples). ``limit`` stops after that many items, or,
    with ``per_task`` on a task-ordered stream, takes them from every task (:func:`task_balanced_order`).
    ``x`` is float32 in ``[0, 1]`` (see :func:`ferret_core.data.dataset.normalise`); ``task`` is 0 when
    the dataset has no task structure.
    """
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be None or >= 0, got {limit}")
    if per_task and limit is not None and not iid:
        order = task_balanced_order(ds, limit)
    else:
        order = stream_order(ds, iid=iid, seed=seed)
        if limit is not None:
            order = order[:limit]
    tasks = ds.tasks_train
    for index, row in enumerate(order.tolist()):
        yield StreamItem(
            index=index,
            x=normalise(ds.x_train[row]),
            y=int(ds.y_train[row]),
            task=0 if tasks is None else int(tasks[row]),
        )


def test_split(ds: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out split as ``(x, y)``: float32 ``(N, *input_shape)`` in ``[0, 1]`` and int64 ``(N,)``."""
    return normalise(ds.x_test), torch.from_numpy(ds.y_test.copy())


test_split.__test__ = False  # type: ignore[attr-defined]  # a library function, not a pytest test
