"""Test accuracy at task boundaries of a task-ordered stream (``split-*``), and forgetting (DESIGN §3.1:
"tacc: accuracy on the held-out test split at the end, and at task boundaries for Split-* streams").

When the stream moves from task k to task k+1 (the first arrival of task k+1, before it is trained on)
and at its end, the current model's accuracy on each task's held-out items is recorded: R[k][j] = accuracy
(percent) on task j after task k, on the first ``per_task`` held-out items of task j (default 500: every
row on the same items, at a fraction of a full evaluation's cost; the binomial standard error is at most
2.2 points). Forgetting of task j (Chaudhry et al., ECCV 2018, "Riemannian Walk"): the best accuracy it had at
an earlier boundary minus its final accuracy, f_j = max_{k < last} R[k][j] − R[last][j]; reported averaged
over the tasks before the last one the stream visited.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ferret_core.errors import ConfigError

Evaluate = Callable[[Tensor, Tensor], float]  # (x, y) → accuracy in percent


class TaskBoundaryAccuracy:
    """Feed the task of every arrival in order (:meth:`observe`), then :meth:`finish`."""

    def __init__(self, x: Tensor, y: Tensor, tasks: Tensor, evaluate: Evaluate, *, per_task: int = 500) -> None:
        if not (len(x) == len(y) == len(tasks)):
            raise ConfigError(f"test x, y and tasks must have one row each, got {len(x)}, {len(y)}, {len(tasks)}")
        if per_task < 1:
            raise ConfigError(f"per_task must be >= 1 held-out items, got {per_task}")
        count = int(tasks.max()) + 1 if len(tasks) else 0
        self.per_task = per_task
        self._splits = [(x[tasks == t][:per_task], y[tasks == t][:per_task]) for t in range(count)]
        self._evaluate = evaluate
        self._current: int | None = None
        self.after_task: list[int] = []
        self.matrix: list[list[float]] = []

    def observe(self, task: int) -> None:
        """The task of the next arrival (call before it is trained); evaluates at a change of task."""
        if self._current is not None and task != self._current:
            self._record(self._current)
        self._current = task

    def finish(self) -> None:
        """The stream has ended: record the last task's row."""
        if self._current is not None:
            self._record(self._current)
            self._current = None

    def _record(self, task: int) -> None:
        self.after_task.append(task)
        self.matrix.append([self._evaluate(x, y) if len(y) else float("nan") for x, y in self._splits])

    def forgetting(self) -> float | None:
        """Mean forgetting over the visited tasks before the last (``None`` with fewer than two rows)."""
        if len(self.matrix) < 2:
            return None
        final = self.matrix[-1]
        drops = [max(row[j] for row in self.matrix[:-1]) - final[j] for j in self.after_task[:-1]]
        return sum(drops) / len(drops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_task_items": [len(y) for _, y in self._splits],
            "after_task": list(self.after_task),
            "accuracy": [list(row) for row in self.matrix],
            "final_by_task": list(self.matrix[-1]) if self.matrix else [],
            "forgetting": self.forgetting(),
        }


def task_tensor(values: Any) -> Tensor:
    """Task ids as an int64 tensor (from a numpy array or a list)."""
    return torch.as_tensor(values, dtype=torch.long)
