"""Drift detection on the stream of prediction outcomes with River's detectors (``river.drift``: ADWIN,
Bifet & Gavaldà 2007, or Page-Hinkley), one per signal:

* ``correct``: 1.0 / 0.0 per labelled prediction (the label known at prediction time): a change in the
  error rate, the drift that matters;
* ``confidence``: the predicted class's probability per unlabelled prediction (labels missing or late): a
  change in how sure the model is, a proxy where no label tells the error.

Only a *fall* is reported (accuracy or confidence going down): ADWIN flags any change of the mean,
and a model that learns raises it (on MNIST it flagged the rise from 22 % to 56 % in the first 400 items);
Page-Hinkley runs in its ``down`` mode. A detection is a :class:`DriftSignal`; the learner turns it into
an event and the configured reaction. Drift is *not* a reason to roll back (both the live model and the
shadow are hurt by it: the guard's test, :mod:`.cusum`, ignores it); it is reported, and may reset the
compensators' state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from river import drift

from ferret_core.errors import ConfigError

DETECTORS = ("adwin", "page-hinkley")


class _Detector(Protocol):
    @property
    def drift_detected(self) -> bool: ...

    def update(self, x: float) -> None: ...


@dataclass(frozen=True, slots=True)
class DriftSignal:
    """A detected drift: ``detector`` names the detector and its signal (``adwin:correct``), ``item`` the
    item whose outcome completed the evidence, ``estimate`` the detector's mean of the signal after it
    (ADWIN; NaN for Page-Hinkley, which keeps none)."""

    detector: str
    item: int
    estimate: float


def make_detector(name: str) -> _Detector:
    """A River detector with its defaults (ADWIN δ 0.002; Page-Hinkley δ 0.005, λ 50, falls only)."""
    if name == "adwin":
        return drift.ADWIN()  # type: ignore[no-untyped-call]
    if name == "page-hinkley":
        return drift.PageHinkley(mode="down")  # a fall of the mean only
    raise ConfigError(f"unknown drift detector {name!r}; expected one of {', '.join(DETECTORS)} (or none)")


class DriftMonitor:
    """Two detectors of one kind: on correctness (labelled items) and on confidence (unlabelled ones)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._correct = make_detector(name)
        self._confidence = make_detector(name)
        self.detections = 0

    def observe(self, item: int, correct: bool | None, confidence: float) -> DriftSignal | None:
        """One prediction's outcome: its correctness where labelled (``correct`` not None), else its
        confidence. Returns the detection, if this outcome completed one."""
        if correct is None:
            detector, signal, value = self._confidence, "confidence", confidence
        else:
            detector, signal, value = self._correct, "correct", float(correct)
        before = float(getattr(detector, "estimation", float("nan")))
        detector.update(value)
        if not detector.drift_detected:
            return None
        estimate = float(getattr(detector, "estimation", float("nan")))
        if estimate > before:  # ADWIN also flags a rise (a model that learns): not a drift to report
            return None
        self.detections += 1
        return DriftSignal(f"{self.name}:{signal}", item, estimate)
