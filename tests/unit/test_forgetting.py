"""Per-task test accuracy at task boundaries, and forgetting."""

from __future__ import annotations

import pytest
import torch

from ferret_core.data.dataset import Dataset
from ferret_core.data.stream import iter_stream, task_balanced_order
from ferret_core.errors import ConfigError
from ferret_core.forgetting import TaskBoundaryAccuracy


def test_rows_at_task_changes_and_forgetting() -> None:
    x = torch.arange(6.0).reshape(6, 1)
    y = torch.zeros(6, dtype=torch.long)
    tasks = torch.tensor([0, 0, 1, 1, 2, 2])
    state = {"known": {0}}

    def evaluate(xs: torch.Tensor, ys: torch.Tensor) -> float:  # knows exactly the tasks in state["known"]
        return 100.0 if int(xs[0, 0]) // 2 in state["known"] else 0.0

    acc = TaskBoundaryAccuracy(x, y, tasks, evaluate)
    for task, known in ((0, {0}), (0, {0}), (1, {0}), (1, {1}), (2, {1, 2})):
        acc.observe(task)
        state["known"] = known
    acc.finish()
    assert acc.after_task == [0, 1, 2]
    assert acc.matrix == [[100.0, 0.0, 0.0], [0.0, 100.0, 0.0], [0.0, 100.0, 100.0]]
    assert acc.forgetting() == pytest.approx(50.0)  # task 0 lost 100 points, task 1 none
    assert acc.to_dict()["final_by_task"] == [0.0, 100.0, 100.0]
    with pytest.raises(ConfigError):
        TaskBoundaryAccuracy(x, y[:2], tasks, evaluate)


def test_short_split_streams_keep_every_task() -> None:
    tasks = torch.tensor([0] * 10 + [1] * 10 + [2] * 10).numpy()
    ds = Dataset("split-x", torch.zeros(30, 1).numpy(), torch.arange(30).numpy() % 3, torch.zeros(3, 1).numpy(),
                 torch.arange(3).numpy() % 3, 3, (1,), tasks_train=tasks, tasks_test=torch.arange(3).numpy())
    order = task_balanced_order(ds, 7)
    assert order.tolist() == [0, 1, 2, 10, 11, 20, 21]
    assert [item.task for item in iter_stream(ds, limit=7, per_task=True)] == [0, 0, 0, 1, 1, 2, 2]
    assert [item.task for item in iter_stream(ds, limit=7)] == [0] * 7
