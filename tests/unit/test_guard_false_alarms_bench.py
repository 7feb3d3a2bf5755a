"""The guard's false-alarm benchmark (benchmarks/guard/false_alarms.py) measures what it says: its
learner trains one item in k while the guard still compares every labelled item, and its table counts
rollbacks before a burst as false alarms."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.guard import false_alarms
from benchmarks.guard.guard_bench import stream
from tests.unit.test_bench import needs_mnist


@needs_mnist
def test_every_kth_trains_one_item_in_k_and_the_guard_compares_all() -> None:
    data = stream(0, 60, "none", 30, 10)
    unguarded = false_alarms.run("clean", "unguarded", None, 0, 3, data, 1e-3)
    guarded = false_alarms.run("clean", "guard", 0.25, 0, 3, data, 1e-3)
    assert unguarded.trained == guarded.trained == 20  # items 0, 3, …, 57
    assert len(unguarded.correct) == len(guarded.correct) == 60
    assert unguarded.correct == guarded.correct  # no rollback in 60 items: the same predictions


def test_the_table_counts_rollbacks_before_the_burst_as_false_alarms() -> None:
    run = false_alarms.Run("fuzz", "guard", 0, 2, correct=[True, False] * 10, trained=10)
    run.rollbacks = [(5, 26.5, 113), (12, float("nan"), 0)]  # a CUSUM one before the burst, a recurrence one after
    row = false_alarms.table([run], at=10).splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[8] == "1" and cells[9] == "2"  # one false rollback; the burst's 2 items after its start
    assert cells[10] == "26.5 / 113, recurrence rule"


def test_main_writes_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_run(scenario, arm, min_drop, seed, k, data, lr, recall_items=None):  # type: ignore[no-untyped-def]
        calls.append((scenario, arm, min_drop, k) + (() if recall_items is None else (recall_items,)))
        return false_alarms.Run(scenario, arm, seed, k, correct=[True] * 4, trained=2)

    monkeypatch.setattr(false_alarms, "run", fake_run)
    monkeypatch.setattr(false_alarms, "stream", lambda *args: [])
    out = tmp_path / "t.md"
    assert false_alarms.main(["--scenarios", "clean", "--min-drops", "0.25", "--out", str(out)]) == 0
    assert calls == [("clean", "unguarded", None, 2), ("clean", "guard, min_drop 0.25", 0.25, 2)]
    assert "| clean | 2 | guard, min_drop 0.25 | 0 | 2 | 100.00 |" in out.read_text()
    calls.clear()
    assert false_alarms.main(["--scenarios", "clean", "--min-drops", "0.25", "--recall-items", "0", "256"]) == 0
    assert calls == [
        ("clean", "unguarded", None, 2),
        ("clean", "guard, min_drop 0.25, recall_items 0", 0.25, 2, 0),
        ("clean", "guard, min_drop 0.25, recall_items 256", 0.25, 2, 256),
    ]
