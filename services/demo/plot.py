"""The demo's figure: online accuracy over time (from the predictions read back) and memory (planned,
measured peak, budget; from the status timeline), with the budget change marked on both panels."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display

import matplotlib.pyplot as plt

from services.demo.accuracy_curve import AccuracyCurve
from services.demo.baseline import BaselineResult
from services.demo.plain_phase import PlainConsumerResult
from services.demo.record import RunRecord
from services.units import format_bytes

MIB = 2**20


def write_plot(
    path: Path,
    curve: AccuracyCurve,
    record: RunRecord,
    origin_ms: int | None,
    baseline: BaselineResult | None = None,
    plain: PlainConsumerResult | None = None,
) -> None:
    """Draw ``curve`` (and the replayed plain loop's, ``baseline``, and the live plain consumer's, ``plain``,
    whose run came after Ferret's: its x is seconds after its own first prediction) and the memory timeline;
    x = seconds after the first prediction (``origin_ms``)."""
    origin = origin_ms if origin_ms is not None else record.started_time_ms
    fig, (acc_ax, mem_ax) = plt.subplots(
        2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}, constrained_layout=True
    )
    acc_ax.plot(curve.seconds, curve.running, color="tab:blue", lw=1.8, label="online accuracy (running)")
    acc_ax.plot(
        curve.seconds,
        curve.windowed,
        color="tab:blue",
        lw=0.8,
        alpha=0.45,
        label=f"accuracy over the last {curve.window} items",
    )
    if baseline is not None and baseline.seconds:
        shift = baseline.origin_s - origin / 1000
        acc_ax.plot(
            [shift + t for t in baseline.seconds],
            baseline.running,
            color="tab:gray",
            lw=1.5,
            ls="--",
            label="plain loop, same items and arrival times (replayed)",
        )
    if plain is not None and plain.seconds:
        acc_ax.plot(
            plain.seconds,
            plain.running,
            color="tab:purple",
            lw=1.5,
            label="plain consumer, same items and rate (live, run after Ferret)",
        )
    acc_ax.set_ylabel("online accuracy (%)")
    acc_ax.set_ylim(0, 100)
    acc_ax.grid(alpha=0.3)
    acc_ax.set_title(
        f"Ferret demo: {record.dataset} / {record.model}, {record.items_produced or record.items_requested} items "
        f"at {record.rate:g}/s"
    )

    points = [p for p in record.timeline if p.time_ms >= origin - 5000]
    if points:
        xs = [(p.time_ms - origin) / 1000 for p in points]
        mem_ax.step(xs, [p.planned_bytes / MIB for p in points], where="post", color="tab:orange", label="planned")
        mem_ax.plot(xs, [p.measured_bytes / MIB for p in points], color="tab:green", label="measured peak")
        budgets = [p.budget_bytes / MIB if p.budget_bytes is not None else None for p in points]
        if any(b is not None for b in budgets):
            mem_ax.step(
                xs,
                [b if b is not None else float("nan") for b in budgets],
                where="post",
                color="tab:red",
                ls="--",
                label="budget",
            )
    mem_ax.set_ylabel("memory (MiB)")
    mem_ax.set_xlabel("seconds since the first prediction")
    mem_ax.set_ylim(bottom=0)
    mem_ax.grid(alpha=0.3)

    for change in record.budget_changes:
        x = ((change.applied_time_ms or change.requested_time_ms) - origin) / 1000
        old = "unconstrained" if change.from_bytes is None else format_bytes(change.from_bytes)
        label = f"budget {old} → {format_bytes(change.to_bytes)}"
        for ax in (acc_ax, mem_ax):
            ax.axvline(x, color="tab:red", lw=1.2, ls=":")
        acc_ax.annotate(
            label,
            xy=(x, 4),
            xytext=(6, 0),
            textcoords="offset points",
            color="tab:red",
            fontsize=9,
            rotation=90,
            va="bottom",
        )
    right = max([*curve.seconds, *[(p.time_ms - origin) / 1000 for p in points], 1.0])
    acc_ax.set_xlim(0, right)
    acc_ax.legend(loc="lower right", fontsize=8)
    if mem_ax.lines:
        mem_ax.legend(loc="lower right", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
