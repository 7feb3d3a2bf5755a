"""The demo's accuracy curve: online accuracy over time from the predictions read back, drawn by
``plot.py`` and computed for it by ``report.py``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.demo.collect import PredictionRecord, distinct_in_time_order


@dataclass(frozen=True)
class AccuracyCurve:
    """Online accuracy over time: x in seconds after the first prediction, y in percent."""

    seconds: list[float]
    running: list[float]  # cumulative oacc, as the trainer reports it
    windowed: list[float]  # accuracy over the last ``window`` labelled predictions
    window: int


def accuracy_curve(records: Sequence[PredictionRecord], window: int = 100) -> AccuracyCurve:
    ordered = [r for r in distinct_in_time_order(records) if r.has_label]
    if not ordered:
        return AccuracyCurve([], [], [], window)
    origin = ordered[0].predicted_time_ms
    seconds, running, windowed = [], [], []
    correct = 0
    hits: list[int] = []
    for n, record in enumerate(ordered, start=1):
        hit = int(record.correct)
        correct += hit
        hits.append(hit)
        in_window = hits[-window:]
        seconds.append((record.predicted_time_ms - origin) / 1000)
        running.append(100.0 * correct / n)
        windowed.append(100.0 * sum(in_window) / len(in_window))
    return AccuracyCurve(seconds, running, windowed, window)
