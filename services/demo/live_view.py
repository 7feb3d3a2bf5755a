"""The terminal view of a running demo, refreshed from the trainer's ``GetStatus``.

On a terminal: a ``rich`` Live table (items, predictions, online accuracy, throughput, skipped by
reason, dead letters, planned vs measured bytes vs budget, plan version, lag). Without one (CI, a pipe)
or with ``--no-live``: a plain line every few seconds and on every phase change.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType
from typing import Protocol, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from services.demo.record import RunRecord, StatusPoint
from services.units import format_bytes

RATE_WINDOW_MS = 3000
log = logging.getLogger("ferret.demo")


class View(Protocol):
    def __enter__(self) -> View: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def update(self, record: RunRecord, phase: str) -> None: ...


def recent_rate(timeline: list[StatusPoint], window_ms: int = RATE_WINDOW_MS) -> float | None:
    """Predictions per second over the last ``window_ms`` of the timeline (None with too few points)."""
    if len(timeline) < 2:
        return None
    last = timeline[-1]
    first = next((p for p in timeline if last.time_ms - p.time_ms <= window_ms), timeline[-2])
    if first is last:
        first = timeline[-2]
    span = (last.time_ms - first.time_ms) / 1000
    return (last.predictions_published - first.predictions_published) / span if span > 0 else None


def _bytes(value: int | None) -> str:
    return "unconstrained" if value is None else format_bytes(value)


def status_rows(record: RunRecord, phase: str) -> list[tuple[str, str]]:
    """(what, value) rows of the live table; pure, so it is tested without a terminal."""
    s = record.last_status
    rows = [("phase", phase)]
    if s is None:
        return rows
    rate = recent_rate(record.timeline)
    target = record.items_produced if record.items_produced is not None else record.items_requested
    skipped = ", ".join(f"{k} {v:,}" for k, v in s.skipped.items()) or "none"
    change = record.budget_changes[-1] if record.budget_changes else None
    rows += [
        ("trainer", f"{s.state}, plan v{s.plan_version}, {s.replans} re-plans, {s.pauses} pauses"),
        ("items consumed", f"{s.items_received:,} of {target:,}"),
        ("predictions", f"{s.predictions_published:,}"),
        ("online accuracy", f"{s.online_accuracy:.2f} %"),
        ("throughput", f"{rate:,.1f} items/s (target {record.rate:g}/s)" if rate is not None else "…"),
        ("trained / skipped", f"{s.dispatched:,} / {skipped}"),
        ("dead letters", f"{s.dead_lettered:,}"),
        ("memory planned / measured", f"{_bytes(s.planned_bytes)} / {_bytes(s.measured_bytes)}"),
        ("budget", _bytes(s.budget_bytes)),
        ("lag", f"{s.lag_items:,} items, {s.lag_seconds:.2f} s"),
        ("latency p50 / p99", f"{s.latency_ms_p50:.1f} / {s.latency_ms_p99:.1f} ms"),
        ("snapshot", f"v{s.last_snapshot_version}" if s.last_snapshot_version else "none yet"),
    ]
    if change is not None:
        rows.append(
            (
                "budget change",
                f"{_bytes(change.from_bytes)} → {_bytes(change.to_bytes)}: plan v{change.plan_version_after}, "
                f"planning {change.planning_seconds * 1e3:.0f} ms, stall {change.stall_seconds * 1e3:.0f} ms",
            )
        )
    refusal = record.budget_refusal
    if refusal is not None:
        rows.append(
            (
                "budget step",
                f"{_bytes(refusal.to_bytes)} refused ({refusal.code}, minimum {_bytes(refusal.min_feasible_bytes)}): "
                f"no smaller plan exists; plan v{refusal.plan_version_after} unchanged",
            )
        )
    return rows


def plain_line(record: RunRecord, phase: str) -> str:
    s = record.last_status
    if s is None:
        return f"[demo] {phase}"
    rate = recent_rate(record.timeline)
    skipped = ",".join(f"{k}={v}" for k, v in s.skipped.items()) or "0"
    return (
        f"[demo] {phase}: consumed {s.items_received} predicted {s.predictions_published} "
        f"oacc {s.online_accuracy:.1f}% rate {rate or 0:.1f}/s trained {s.dispatched} skipped {skipped} "
        f"dlq {s.dead_lettered} mem {_bytes(s.planned_bytes)} planned / {_bytes(s.measured_bytes)} measured / "
        f"budget {_bytes(s.budget_bytes)} plan v{s.plan_version} lag {s.lag_items}"
    )


class RichView:
    """A rich Live table on ``stream`` (a terminal)."""

    def __init__(self, stream: TextIO) -> None:
        self._console = Console(file=stream)
        self._live = Live(console=self._console, auto_refresh=False, transient=False)

    def __enter__(self) -> RichView:
        self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.__exit__(exc_type, exc, tb)

    def update(self, record: RunRecord, phase: str) -> None:
        table = Table(title=f"ferret demo — {record.dataset} / {record.model}", show_header=False, box=None)
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for what, value in status_rows(record, phase):
            table.add_row(what, value)
        self._live.update(table, refresh=True)


class LineView:
    """Plain lines on ``stream``: one every ``every_s`` seconds and one per phase change."""

    def __init__(self, stream: TextIO, every_s: float = 5.0) -> None:
        self._stream = stream
        self._every_s = every_s
        self._last_line = -float("inf")
        self._last_phase = ""

    def __enter__(self) -> LineView:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def update(self, record: RunRecord, phase: str) -> None:
        now = time.monotonic()
        if phase == self._last_phase and now - self._last_line < self._every_s:
            return
        self._last_phase, self._last_line = phase, now
        print(plain_line(record, phase), file=self._stream, flush=True)


class JsonLineView(LineView):
    """Like :class:`LineView`, as JSON log records (``--log-format json``): the message is the plain line,
    the counters are fields of their own."""

    def update(self, record: RunRecord, phase: str) -> None:
        now = time.monotonic()
        if phase == self._last_phase and now - self._last_line < self._every_s:
            return
        self._last_phase, self._last_line = phase, now
        s = record.last_status
        fields: dict[str, object] = {"phase": phase}
        if s is not None:
            fields.update(
                items_received=s.items_received,
                predictions_published=s.predictions_published,
                online_accuracy=s.online_accuracy,
                dispatched=s.dispatched,
                skipped=dict(s.skipped),
                dead_lettered=s.dead_lettered,
                planned_bytes=s.planned_bytes,
                measured_bytes=s.measured_bytes,
                budget_bytes=s.budget_bytes,
                plan_version=s.plan_version,
                lag_items=s.lag_items,
            )
        log.info(plain_line(record, phase), extra=fields)


def make_view(live: bool, stream: TextIO | None = None, log_format: str = "text") -> View:
    """The rich table when ``live`` and ``stream`` (default stderr) is a terminal, else plain lines
    (JSON log records under ``log_format="json"``)."""
    out = stream if stream is not None else sys.stderr
    if log_format == "json":
        return JsonLineView(out)
    if live and out.isatty():
        return RichView(out)
    return LineView(out)
