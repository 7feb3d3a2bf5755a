"""The plain-loop baseline of the demo's report (services/demo/baseline.py): replayed on a virtual clock,
it is a plain sequential SGD loop when the loop keeps up, skips what waited behind earlier work, and the
report shows it beside Ferret."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from services.demo.baseline import BaselineItem, demo_baseline, replay_plain_loop
from services.demo.report import render_markdown, write_report
from tests.unit.test_demo_report import outcome, run_record, stream


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))


def _items(event_times: list[float]) -> list[BaselineItem]:
    gen = torch.Generator().manual_seed(1)
    return [
        BaselineItem(t, torch.randn(6, generator=gen), int(torch.randint(0, 4, (), generator=gen))) for t in event_times
    ]


def _ticks(step: float):  # type: ignore[no-untyped-def]
    """A clock that advances ``step`` seconds per reading: every predict and SGD step takes ``step``."""
    counter = itertools.count()
    return lambda: step * next(counter)


def test_a_loop_that_keeps_up_is_plain_sequential_sgd_on_every_item() -> None:
    items = _items([1.0 * i for i in range(30)])
    model, reference = _model(), _model()
    result = replay_plain_loop(items, model, lr=0.1, clock=_ticks(0.001))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    correct = 0
    for item in items:
        with torch.no_grad():
            correct += int(reference(item.x.unsqueeze(0)).argmax(1).item() == item.label)
        optimizer.zero_grad()
        F.cross_entropy(reference(item.x.unsqueeze(0)), torch.tensor([item.label])).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    assert result.trained == result.items == 30 and result.correct == correct
    assert_close(dict(model.state_dict()), dict(reference.state_dict()), rtol=0.0, atol=0.0)
    assert result.accuracy == 100.0 * correct / 30 and len(result.running) == 30


def test_items_that_waited_behind_earlier_work_are_predicted_but_not_trained() -> None:
    """A burst of 6 at t = 0; predict and SGD step take 50 ms each; an item is trained only if reached and
    predicted within 200 ms: items 0 (done at 0.10 s) and 1 (predicted at 0.15 s, done at 0.20 s) are;
    item 2 is predicted at 0.25 s, too late, and so are the rest."""
    model = _model()
    before = copy.deepcopy(model.state_dict())
    result = replay_plain_loop(_items([0.0] * 6), model, lr=0.1, max_age_s=0.2, clock=_ticks(0.05))
    assert result.items == 6 and result.trained == 2
    assert [round(t, 9) for t in result.seconds] == [0.05, 0.15, 0.25, 0.3, 0.35, 0.4]
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_demo_report_shows_the_plain_loop_beside_ferret(tmp_path: Path) -> None:
    records = stream(60)  # digits/0..59, labelled, 20 ms apart
    baseline = demo_baseline(records, "digits", "mlp", None)
    assert baseline is not None and baseline.items == 60 and baseline.trained == 60  # 50 items/s: keeps up
    assert baseline.origin_s == (records[0].predicted_time_ms - records[0].latency_ms) / 1000
    summary = write_report(tmp_path, run_record(tmp_path), outcome(records), baseline)
    plain = json.loads((tmp_path / "summary.json").read_text())["plain_loop"]
    assert plain["items"] == 60 and plain["online_accuracy"] == baseline.accuracy
    assert "plain loop, same items and arrival times (replayed)" in render_markdown(summary)
    assert Path(summary["files"]["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert write_report(tmp_path, run_record(tmp_path), outcome(records))["plain_loop"] is None
