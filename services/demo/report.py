"""The demo's report: ``summary.json``, ``report.md`` (a table) and the accuracy plot (``plot.py``).

Counts, accuracy, latency and throughput of the published predictions come from the independent
consumer's read-back (``collect.py``), never from the trainer's say-so alone; the trainer's own counters
(GetStatus) stand next to them so a mismatch shows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferret_core.metrics import LatencyQuantiles
from services import strict_json
from services.demo.accuracy_curve import accuracy_curve
from services.demo.collect import Outcome, PredictionRecord, distinct_in_time_order
from services.demo.plain_phase import PLAIN_LOG, PlainConsumerResult
from services.demo.record import RunRecord
from services.units import format_bytes

if TYPE_CHECKING:
    from services.demo.baseline import BaselineResult

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOT_FILE = "online_accuracy.png"
TIMELINE_FILE = "timeline.json"
TRAINER_LOG = "trainer.log"
PRODUCER_LOG = "producer.log"


@dataclass(frozen=True)
class PredictionStats:
    """Statistics of the predictions read back, one per distinct sample id (a re-emitted duplicate
    counts once; the first non-duplicate record is the one kept)."""

    distinct: int = 0
    records: int = 0
    labelled: int = 0
    correct: int = 0
    latency_ms_p50: float | None = None
    latency_ms_p99: float | None = None
    latency_ms_max: float | None = None
    latency_ms_mean: float | None = None
    # Over the items produced after the first prediction: without the backlog that queues while the
    # trainer joins its consumer group (a few seconds on the embedded broker).
    latency_ms_p50_steady: float | None = None
    latency_ms_p99_steady: float | None = None
    first_time_ms: int | None = None
    last_time_ms: int | None = None
    decisions: dict[str, int] = field(default_factory=dict)

    @property
    def accuracy(self) -> float | None:
        """Online accuracy in percent over the labelled predictions (None when none had a label)."""
        return 100.0 * self.correct / self.labelled if self.labelled else None

    @property
    def span_s(self) -> float:
        if self.first_time_ms is None or self.last_time_ms is None:
            return 0.0
        return (self.last_time_ms - self.first_time_ms) / 1000

    @property
    def throughput(self) -> float | None:
        """Predictions per second between the first and the last one."""
        return (self.distinct - 1) / self.span_s if self.distinct > 1 and self.span_s > 0 else None


def _quantiles(values: Iterable[float]) -> dict[str, float]:
    """p50 and p99 of ``values`` ({} when there are none)."""
    kept = [max(0.0, v) for v in values]
    if not kept:
        return {}
    latency = LatencyQuantiles(quantiles=(0.5, 0.99), window=len(kept))
    latency.update_many(kept)
    return latency.get()


def prediction_stats(records: Sequence[PredictionRecord]) -> PredictionStats:
    ordered = distinct_in_time_order(records)
    if not ordered:
        return PredictionStats(records=len(records))
    latency = LatencyQuantiles(quantiles=(0.5, 0.99), window=len(ordered))
    latency.update_many(max(0.0, r.latency_ms) for r in ordered)
    quantiles = latency.get()
    labelled = [r for r in ordered if r.has_label]
    first = ordered[0].predicted_time_ms
    steady = _quantiles(r.latency_ms for r in ordered if r.predicted_time_ms - r.latency_ms >= first)
    return PredictionStats(
        distinct=len(ordered),
        records=len(records),
        labelled=len(labelled),
        correct=sum(r.correct for r in labelled),
        latency_ms_p50=quantiles["p50"],
        latency_ms_p99=quantiles["p99"],
        latency_ms_max=latency.max,
        latency_ms_mean=latency.mean,
        latency_ms_p50_steady=steady.get("p50"),
        latency_ms_p99_steady=steady.get("p99"),
        first_time_ms=first,
        last_time_ms=ordered[-1].predicted_time_ms,
        decisions=dict(sorted(Counter(r.decision for r in ordered).items())),
    )


def build_summary(
    record: RunRecord,
    outcome: Outcome | None,
    files: dict[str, str],
    baseline: BaselineResult | None = None,
    plain: PlainConsumerResult | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` document (keys are stable; absent knowledge is ``null``). ``baseline``: the plain
    loop replayed on the same items at their measured arrival times (:mod:`services.demo.baseline`);
    ``plain``: the live plain consumer on the same items and rate (:mod:`services.demo.plain_phase`)."""
    stats = prediction_stats(outcome.predictions) if outcome is not None else PredictionStats()
    status = record.last_status
    before, after = record.plan_before, record.plan_after or record.plan_before
    ended = record.ended_time_ms or record.started_time_ms
    return {
        "ok": record.error is None,
        "complete": record.complete,
        "error": record.error,
        "dataset": record.dataset,
        "model": record.model,
        "profile": record.profile,
        "rate": record.rate,
        "items_requested": record.items_requested,
        "topic_prefix": record.topic_prefix,
        "bootstrap_servers": record.bootstrap_servers,
        "redis_url": record.redis_url,
        "stack": record.stack,
        "control_target": record.control_target,
        "started_at": datetime.fromtimestamp(record.started_time_ms / 1000).isoformat(timespec="seconds"),
        "duration_s": round((ended - record.started_time_ms) / 1000, 3),
        "trainer_ready_s": record.trainer_ready_s,
        "items_produced": record.items_produced,
        "samples_counted_from_topic": outcome.samples_count.distinct if outcome else None,
        "predictions_published": status.predictions_published if status else None,
        "predictions_counted_from_topic": outcome.predictions_count.distinct if outcome else None,
        "prediction_records_read": outcome.predictions_count.records if outcome else None,
        "duplicates_read": outcome.predictions_count.duplicates if outcome else None,
        "dlq": status.dead_lettered if status else None,
        "dlq_counted_from_topic": outcome.dlq_count.records if outcome else None,
        "online_accuracy": status.online_accuracy if status else None,
        "online_accuracy_from_topic": stats.accuracy,
        "labelled_predictions": stats.labelled,
        "trained": status.dispatched if status else None,
        "backward_passes": status.backward_passes if status else None,
        "skipped": status.skipped if status else {},
        "decisions_from_topic": stats.decisions,
        "budget_bytes_before": before.budget_bytes if before else None,
        "budget_bytes": after.budget_bytes if after else None,
        "budget_changes": [c.to_dict(stats.first_time_ms) for c in record.budget_changes],
        "budget_step": record.budget_step,  # what the step asked for and why (a cut, or a refusal to show)
        "budget_refusal": None if record.budget_refusal is None else record.budget_refusal.to_dict(stats.first_time_ms),
        "snapshots": {
            "requested": record.snapshot_requested,  # the demo's SaveSnapshot reply
            "in_redis": record.snapshots_stored,  # what Redis holds after the trainer's exit (pruned to `keep`)
            "written": max((int(s["version"]) for s in record.snapshots_stored), default=0),
        },
        "plans": {"before": before.plan if before else None, "after": after.plan if after else None},
        "plan_versions": {"before": before.version if before else None, "after": after.version if after else None},
        "planned_bytes_before": before.planned_bytes if before else None,
        "planned_bytes": after.planned_bytes if after else None,
        "min_feasible_bytes": before.min_feasible_bytes if before else None,
        "measured_peak_bytes": status.measured_bytes if status else None,
        "measured_peak_bytes_before_change": record.measured_bytes_before_change,
        "throughput_items_per_s": stats.throughput,
        "trainer_items_per_s": status.items_per_second if status else None,
        "latency_ms_p50": stats.latency_ms_p50,
        "latency_ms_p99": stats.latency_ms_p99,
        "latency_ms_max": stats.latency_ms_max,
        "latency_ms_mean": stats.latency_ms_mean,
        "latency_ms_p50_steady": stats.latency_ms_p50_steady,
        "latency_ms_p99_steady": stats.latency_ms_p99_steady,
        "trainer_exit_code": record.trainer_exit_code,
        "producer_exit_code": record.producer_exit_code,
        "plain_loop": None
        if baseline is None
        else {
            "online_accuracy": baseline.accuracy,
            "items": baseline.items,
            "trained": baseline.trained,
            "predict_ms": baseline.predict_ms,
            "train_ms": baseline.train_ms,
            "how": "replayed on a virtual clock: the same items at their measured event times, measured compute",
        },
        "plain_consumer": None if plain is None else plain.to_dict(),
        "files": files,
    }


def _bytes(value: int | None) -> str:
    return "unconstrained" if value is None else format_bytes(value)


def _num(value: float | None, fmt: str = "{:,.1f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def table_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The report table: (what, value) rows shared by report.md and the terminal."""
    s = summary
    count, pct, ms, per_s = "{:,}", "{:.2f} %", "{:.1f} ms", "{:,.1f} items/s"
    profile = f"profile {Path(s['profile']).name}" if s["profile"] else "profiled at start"
    skipped = ", ".join(f"{k} {v:,}" for k, v in s["skipped"].items()) or "none"
    rows = [
        ("dataset / model", f"{s['dataset']} / {s['model']} ({profile})"),
        ("rate, duration", f"{s['rate']:g} items/s, {s['duration_s']:.1f} s"),
        ("items produced", _num(s["items_produced"], count)),
        ("samples on topic (read back)", _num(s["samples_counted_from_topic"], count)),
        ("predictions published (trainer)", _num(s["predictions_published"], count)),
        ("predictions on topic (read back, distinct)", _num(s["predictions_counted_from_topic"], count)),
        ("duplicates read back", _num(s["duplicates_read"], count)),
        ("dead letters (trainer / topic)", f"{_num(s['dlq'], count)} / {_num(s['dlq_counted_from_topic'], count)}"),
        ("trained (dispatched)", _num(s["trained"], count)),
        ("skipped", skipped),
        (
            "online accuracy (trainer / read back)",
            f"{_num(s['online_accuracy'], pct)} / {_num(s['online_accuracy_from_topic'], pct)}",
        ),
    ]
    plain = s.get("plain_loop")
    if plain is not None:
        rows.append(
            (
                "plain loop, same items and arrival times (replayed)",
                f"online accuracy {_num(plain['online_accuracy'], pct)}, trained {plain['trained']:,} of "
                f"{plain['items']:,} (predict {plain['predict_ms']:.2f} ms, SGD step {plain['train_ms']:.2f} ms)",
            )
        )
    live_plain = s.get("plain_consumer")
    if live_plain is not None:
        rows.append(
            (
                "plain consumer, same items and rate (live, after Ferret)",
                f"no result: {live_plain['error']}"
                if live_plain["error"] is not None
                else f"online accuracy {_num(live_plain['online_accuracy'], pct)}, trained {live_plain['trained']:,} "
                f"of {live_plain['labelled']:,}, latency p50 {_num(live_plain['latency_ms_p50'])} ms / p99 "
                f"{_num(live_plain['latency_ms_p99'])} ms",
            )
        )
    rows += [
        ("budget", f"{_bytes(s['budget_bytes_before'])} → {_bytes(s['budget_bytes'])}"),
        ("planned bytes", f"{_bytes(s['planned_bytes_before'])} → {_bytes(s['planned_bytes'])}"),
        ("min feasible bytes", _bytes(s["min_feasible_bytes"])),
        (
            "measured peak bytes (before change / end)",
            f"{_bytes(s['measured_peak_bytes_before_change'])} / {_bytes(s['measured_peak_bytes'])}",
        ),
    ]
    for change in s["budget_changes"]:
        when = "n/a" if change["time_s"] is None else f"{change['time_s']:.1f} s"
        rows.append(
            (
                "budget change",
                f"at {when}: {_bytes(change['from'])} → {_bytes(change['to'])}, plan "
                f"v{change['plan_version_before']} → v{change['plan_version_after']}, planning "
                f"{change['planning_seconds'] * 1e3:.1f} ms, stall {change['stall_seconds'] * 1e3:.1f} ms",
            )
        )
    refusal = s.get("budget_refusal")
    if refusal is not None:
        when = "n/a" if refusal["time_s"] is None else f"{refusal['time_s']:.1f} s"
        rows.append(
            (
                "budget step (no smaller plan exists)",
                f"at {when}: SetMemoryBudget({_bytes(refusal['to'])}) refused: {refusal['code']}, minimum feasible "
                f"{_bytes(refusal['min_feasible_bytes'])}; plan v{refusal['plan_version_before']} → "
                f"v{refusal['plan_version_after']} ({'changed' if refusal['plan_changed'] else 'unchanged'})",
            )
        )
    snapshots = s["snapshots"]
    requested = snapshots["requested"]
    rows += [
        (
            "throughput (read back / trainer's average since start)",
            f"{_num(s['throughput_items_per_s'], per_s)} / {_num(s['trainer_items_per_s'], per_s)}",
        ),
        ("latency p50 / p99", f"{_num(s['latency_ms_p50'], ms)} / {_num(s['latency_ms_p99'], ms)}"),
        (
            "latency p50 / p99 after the first prediction",
            f"{_num(s['latency_ms_p50_steady'], ms)} / {_num(s['latency_ms_p99_steady'], ms)}",
        ),
        (
            "snapshots (written / kept in Redis)",
            f"{snapshots['written']} / {len(snapshots['in_redis'])}; requested over gRPC: "
            + (f"v{requested['version']}, {_bytes(requested['total_bytes'])}" if requested else "none"),
        ),
    ]
    return rows


def render_markdown(summary: dict[str, Any]) -> str:
    status = "complete" if summary["ok"] and summary["complete"] else f"FAILED: {summary['error'] or 'incomplete'}"
    lines = [
        f"# Ferret demo {summary['started_at']} ({status})",
        "",
        f"Topics `{summary['topic_prefix']}.*` on {summary['bootstrap_servers']} ({summary['stack']}); "
        f"Redis {summary['redis_url']}.",
        "",
        "| what | value |",
        "|---|---|",
        *(f"| {what} | {value.replace('|', '/')} |" for what, value in table_rows(summary)),
        "",
    ]
    plot = summary["files"].get("plot")
    if plot:
        lines += [f"![online accuracy]({Path(plot).name})", ""]
    return "\n".join(lines)


def write_report(
    out_dir: Path,
    record: RunRecord,
    outcome: Outcome | None,
    baseline: BaselineResult | None = None,
    plain: PlainConsumerResult | None = None,
) -> dict[str, Any]:
    """Write summary.json, report.md, timeline.json and (with predictions) the plot; return the summary.
    ``baseline``: the plain loop replayed on the same items, ``plain``: the live plain consumer on them
    (both drawn beside Ferret's curve)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "summary": str(out_dir / SUMMARY_FILE),
        "report": str(out_dir / REPORT_FILE),
        "timeline": str(out_dir / TIMELINE_FILE),
        "trainer_log": str(out_dir / TRAINER_LOG),
        "producer_log": str(out_dir / PRODUCER_LOG),
    }
    if outcome is not None and outcome.predictions:
        from services.demo.plot import write_plot  # matplotlib only when there is something to draw

        curve = accuracy_curve(outcome.predictions)
        origin = prediction_stats(outcome.predictions).first_time_ms
        write_plot(out_dir / PLOT_FILE, curve, record, origin, baseline, plain)
        files["plot"] = str(out_dir / PLOT_FILE)
    if plain is not None:
        files["plain_consumer_log"] = str(out_dir / PLAIN_LOG)
    summary = build_summary(record, outcome, files, baseline, plain)
    (out_dir / SUMMARY_FILE).write_text(strict_json.dumps(summary, indent=2) + "\n")
    (out_dir / REPORT_FILE).write_text(render_markdown(summary))
    timeline = [point.__dict__ for point in record.timeline]
    (out_dir / TIMELINE_FILE).write_text(strict_json.dumps(timeline) + "\n")
    return summary
