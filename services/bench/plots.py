"""PNG plots of the bench: online accuracy against measured memory (overall, algorithms), the pipelines'
five-budget sweep (oacc vs memory per strategy, the paper's figure; Ferret's oacc vs log R_F), and the
compensators' oacc differences. matplotlib with the Agg backend (no display)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.bench.reports import MIB, field, seeds_of, settings_of, sweep_points

Rows = Sequence[dict[str, Any]]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(count: int) -> tuple[Any, list[Any]]:
    plt = _pyplot()
    cols = min(count, 3)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat


def oacc_vs_memory(rows: Rows, path: Path, title: str) -> Path | None:
    """One panel per setting: each column's mean oacc against its mean measured MiB (error bars: s.e.)."""
    settings = settings_of(rows)
    if not settings:
        return None
    fig, axes = _grid(len(settings))
    for ax, setting in zip(axes, settings, strict=False):
        for column in dict.fromkeys(r["column"] for r in rows if r["setting"] == setting):
            runs = seeds_of(rows, setting, column)
            if not runs:
                continue
            oacc, mem = field(runs, "oacc"), field(runs, "peak_bytes", MIB)
            ax.errorbar(mem.mean, oacc.mean, xerr=mem.se, yerr=oacc.se, fmt="o", capsize=3, label=column)
        ax.set(title=setting, xlabel="measured peak memory (MiB)", ylabel="online accuracy (%)", xscale="log")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def sweep(rows: Rows, path: Path) -> Path | None:
    settings = [s for s in settings_of(rows) if sweep_points(rows, s)]
    if not settings:
        return None
    fig, axes = _grid(len(settings))
    for ax, setting in zip(axes, settings, strict=False):
        for strategy, pts in sweep_points(rows, setting).items():
            ax.errorbar(
                [m.mean for _, _, m, _ in pts],
                [o.mean for _, o, _, _ in pts],
                yerr=[o.se for _, o, _, _ in pts],
                marker="o",
                capsize=3,
                label=strategy,
            )
        ax.set(title=setting, xlabel="measured peak memory (MiB)", ylabel="online accuracy (%)", xscale="log")
        ax.legend(fontsize=7)
    fig.suptitle("oacc vs memory over five budgets (M-, halfway, M, halfway, M+), no compensation")
    return _save(fig, path)


def rate_vs_oacc(rows: Rows, path: Path) -> Path | None:
    points = []
    for setting in settings_of(rows):
        for _, oacc, _, rate in sweep_points(rows, setting).get("ferret", []):
            if not rate.empty and rate.mean > 0:
                points.append((setting, math.log(rate.mean), oacc.mean))
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for setting in dict.fromkeys(p[0] for p in points):
        ax.plot(
            [p[1] for p in points if p[0] == setting], [p[2] for p in points if p[0] == setting], "o-", label=setting
        )
    ax.set(xlabel="log R_F (planner)", ylabel="online accuracy (%)", title="Ferret: oacc vs log R_F over the sweep")
    ax.legend(fontsize=7)
    return _save(fig, path)


def compensation(rows: Rows, path: Path) -> Path | None:
    settings = settings_of(rows)
    if not settings:
        return None
    fig, axes = _grid(len(settings))
    for ax, setting in zip(axes, settings, strict=False):
        for offset, budget in enumerate(("M+", "M")):
            none = seeds_of(rows, setting, f"ferret-{budget}", budget=budget, compensator="none")
            names, means = [], []
            for c in dict.fromkeys(r["compensator"] for r in rows if r["setting"] == setting):
                runs = seeds_of(rows, setting, f"ferret-{budget}", budget=budget, compensator=c)
                diffs = [runs[s]["oacc"] - none[s]["oacc"] for s in sorted(runs.keys() & none.keys())]
                if c != "none" and diffs:
                    names.append(c)
                    means.append(sum(diffs) / len(diffs))
            xs = [i + 0.4 * offset for i in range(len(names))]
            ax.bar(xs, means, width=0.4, label=f"Ferret {budget}")
            ax.set_xticks([i + 0.2 for i in range(len(names))], names, rotation=30, fontsize=7)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set(title=setting, ylabel="oacc − oacc(none), points")
        ax.legend(fontsize=7)
    fig.suptitle("Compensators on one fixed plan per setting")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path
