"""Class-incremental ``split-<name>`` streams: the classes cut into consecutive groups, one per task.

With ``num_tasks = 5`` and C classes, task k holds classes ``np.array_split(range(C), 5)[k]`` (equal
groups when 5 divides C; otherwise the first groups are one class larger: Covertype's 7 classes give
2, 2, 1, 1, 1). Both splits are reordered task by task with a *stable* sort, so the order inside a
task is the base dataset's (already shuffled where the base loader shuffles). ``tasks_*`` are filled.
"""

from __future__ import annotations

import numpy as np

from ferret_core.data.dataset import Dataset
from ferret_core.errors import ConfigError

NUM_TASKS = 5


def class_to_task(num_classes: int, num_tasks: int = NUM_TASKS) -> np.ndarray:
    """``int64 (num_classes,)``: the task of each class (consecutive, near-equal groups)."""
    if num_classes < num_tasks:
        raise ConfigError(f"a {num_tasks}-task split needs at least {num_tasks} classes, got {num_classes}")
    mapping = np.empty(num_classes, dtype=np.int64)
    for task, group in enumerate(np.array_split(np.arange(num_classes), num_tasks)):
        mapping[group] = task
    return mapping


def split_by_class(ds: Dataset, num_tasks: int = NUM_TASKS) -> Dataset:
    """The class-incremental version of ``ds`` named ``split-<name>``, ordered task by task."""
    mapping = class_to_task(ds.num_classes, num_tasks)
    tasks_train = mapping[ds.y_train]
    tasks_test = mapping[ds.y_test]
    tr = np.argsort(tasks_train, kind="stable")
    te = np.argsort(tasks_test, kind="stable")
    return Dataset(
        name=f"split-{ds.name}",
        x_train=ds.x_train[tr],
        y_train=ds.y_train[tr],
        x_test=ds.x_test[te],
        y_test=ds.y_test[te],
        num_classes=ds.num_classes,
        input_shape=ds.input_shape,
        tasks_train=tasks_train[tr],
        tasks_test=tasks_test[te],
    )
