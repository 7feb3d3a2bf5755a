"""Why an online accuracy is what it is: replay a live side-by-side run's stream offline (issue 7, the
MNIST 2× gap).

A 1 × 1 Ferret run updates the master in place with plain SGD, bit-identical to the plain loop's step
(``tests/unit/test_engine_wall.py``), items in stream order. So the model that predicted item i live is
the fresh model (the trainer's initial weights, as the plain loop's) after SGD steps on the first
``updates[i]`` of the run's trained items, both stored per item in the side-by-side JSON (``per_item``).
This script rebuilds that model in a plain loop for every prediction and scores the run three ways:

- **replay as live**: item i predicted after the first ``updates[i]`` trained items (the live prediction
  lag). It must reproduce the live run's ``correct`` bits (reported: how many agree): the check that
  the replay is the run.
- **replay, no lag**: item i predicted after *every* item trained before it in the stream, as the plain
  loop predicts (one item at a time, right after training the previous one).
- the **lag** itself: mean over items of (items trained before i) − ``updates[i]``.

Then for Ferret − plain at one rate and repeat (the same items): (live − no lag) is what the prediction
lag costs, (no lag of Ferret − no lag of plain) what the choice of trained items costs.

    .venv/bin/python -m benchmarks.live.replay                                  # MNIST/MNISTNet JSON
    .venv/bin/python -m benchmarks.live.replay --dataset digits --model mlp --multipliers 1 2
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.live.plain_loop import PlainLoop, trainer_settings
from benchmarks.live.side_by_side import CONFIGS, RESULTS, mean_se
from ferret_core.data import load_dataset, normalise
from services.config.data_root import default_data_root

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def stream_rows(n_data: int, items: int, repeat: int) -> list[int]:
    """The dataset rows of a repeat's measured stream, as the producer orders them (``producer_options``:
    in order at repeat 0, ``default_rng(repeat).permutation`` after)."""
    order = np.random.default_rng(repeat).permutation(n_data) if repeat > 0 else np.arange(n_data)
    return [int(r) for r in order[:items]]


def replay(
    settings: Any, xs: list[torch.Tensor], ys: list[int], trained: str, updates: list[int]
) -> dict[str, Any]:
    """Online accuracy of the stream replayed as live (lagged) and without lag (module docstring)."""
    n = len(xs)
    order = [i for i in range(n) if trained[i] == "1"]
    before = np.cumsum([0] + [int(trained[i] == "1") for i in range(n)])[:n]  # trained items before i
    lagged = [min(max(0, u), int(b)) for u, b in zip(updates, before, strict=True)]
    # no lag: predict i, then train it if it was trained
    loop = PlainLoop(settings)
    no_lag = []
    for i in range(n):
        no_lag.append(int(loop.predict(xs[i]) == ys[i]))
        if trained[i] == "1":
            loop.train(xs[i], ys[i])
    # as live: after k trained items, predict every item whose prediction saw k updates
    loop = PlainLoop(settings)
    by_version: dict[int, list[int]] = {}
    for i, k in enumerate(lagged):
        by_version.setdefault(k, []).append(i)
    as_live = [0] * n
    for k in range(len(order) + 1):
        for i in by_version.get(k, []):
            as_live[i] = int(loop.predict(xs[i]) == ys[i])
        if k < len(order):
            loop.train(xs[order[k]], ys[order[k]])
    lag = [int(b) - k for b, k in zip(before, lagged, strict=True)]
    return {
        "as_live": 100 * sum(as_live) / n,
        "no_lag": 100 * sum(no_lag) / n,
        "as_live_bits": "".join(map(str, as_live)),
        "mean_lag": sum(lag) / n,
        "lag_by_fifth": [float(np.mean(part)) for part in np.array_split(np.array(lag), 5)],
        "max_lag": max(lag, default=0),
        "trained": len(order),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="mnistnet")
    parser.add_argument("--json", default=None, help="side-by-side JSON (default results/side_by_side-D-M.json)")
    parser.add_argument("--multipliers", type=float, nargs="*", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    name = f"side_by_side-{args.dataset}-{args.model}"
    source = Path(args.json) if args.json else RESULTS / f"{name}.json"
    payload = json.loads(source.read_text())
    settings = trainer_settings(args.dataset, args.model)
    data = load_dataset(args.dataset, default_data_root())
    n_data = len(data.y_train)
    out_rows = []
    for row in payload["rows"]:
        if "per_item" not in row or (args.multipliers and row["multiplier"] not in args.multipliers):
            continue
        repeat = row.get("repeat", 0)
        rows = stream_rows(n_data, len(row["per_item"]["correct"]), repeat)
        xs = [normalise(np.ascontiguousarray(data.x_train[r])) for r in rows]
        ys = [int(data.y_train[r]) for r in rows]
        log = row["per_item"]
        if "-" in log["correct"]:
            continue  # an item not predicted: the stream is not replayable as it was
        r = replay(settings, xs, ys, log["trained"], log["updates"])
        agree = sum(a == b for a, b in zip(r.pop("as_live_bits"), log["correct"], strict=True)) / len(ys)
        live = 100 * log["correct"].count("1") / len(ys)
        out = {
            "config": row["config"], "multiplier": row["multiplier"], "repeat": repeat, "live": live,
            **r, "agree_pct": 100 * agree,
        }  # fmt: skip
        print(json.dumps(out), flush=True)
        out_rows.append(out)
    result = {
        "source": str(source.resolve().relative_to(ROOT)) if source.resolve().is_relative_to(ROOT) else str(source),
        "source_commit": payload.get("commit"),
        "rows": out_rows,
    }
    stem = args.out or f"replay-{args.dataset}-{args.model}"
    out = Path(stem) if "/" in stem else RESULTS / stem
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(render(result))
    print(render(result))
    return 0


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        f"# Replay of {result['source']} (at {result['source_commit']})",
        "",
        "Per config and rate, mean ± s.e. over repeats. *live*: the run's online accuracy; *as live*: replayed "
        "with each prediction on the model after the updates it saw live (must equal live: *agree* is the "
        "share of items whose correctness the replay reproduced); *no lag*: each item predicted after every "
        "item trained before it; *lag*: items trained before an item but not yet in the model that predicted "
        "it (mean, max; and its mean over each fifth of the stream, averaged over repeats).",
        "",
        "| rate | config | trained | live % | as live % | agree % | no lag % | live − no lag | lag (mean / max) "
        "| lag by fifth of the stream |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in sorted({r["multiplier"] for r in rows}):
        for config in CONFIGS:
            rs = [r for r in rows if r["multiplier"] == m and r["config"] == config]
            if not rs:
                continue

            def f(key: str, rs: list[dict[str, Any]] = rs) -> str:
                mean, se = mean_se([r[key] for r in rs])
                return f"{mean:.1f}" if math.isnan(se) else f"{mean:.1f} ± {se:.1f}"

            diff = [r["live"] - r["no_lag"] for r in rs]
            dm, ds = mean_se(diff)
            lines.append(
                f"| {m}× | {config} | {f('trained')} | {f('live')} | {f('as_live')} | {f('agree_pct')} | "
                f"{f('no_lag')} | {dm:+.1f}{'' if math.isnan(ds) else f' ± {ds:.1f}'} | "
                f"{f('mean_lag')} / {max(r['max_lag'] for r in rs)} | "
                f"{' '.join(f'{v:.0f}' for v in np.mean([r['lag_by_fifth'] for r in rs], axis=0))} |"
            )
    lines += ["", "Paired (same repeat, same items), Ferret − plain:", ""]
    lines += ["| rate | live | no lag (which items) | live − no lag of Ferret (the lag) |", "|---|---|---|---|"]
    for m in sorted({r["multiplier"] for r in rows}):
        by = {(r["config"], r["repeat"]): r for r in rows if r["multiplier"] == m}
        reps = sorted(k for c, k in by if c == "ferret" and ("plain", k) in by)
        if not reps:
            continue
        live = [by[("ferret", k)]["live"] - by[("plain", k)]["live"] for k in reps]
        items = [by[("ferret", k)]["no_lag"] - by[("plain", k)]["no_lag"] for k in reps]
        lag = [by[("ferret", k)]["live"] - by[("ferret", k)]["no_lag"] for k in reps]

        def g(v: list[float]) -> str:
            mean, se = mean_se(v)
            return f"{mean:+.1f}" + ("" if math.isnan(se) else f" ± {se:.1f}") + f" (n = {len(v)})"

        lines.append(f"| {m}× | {g(live)} | {g(items)} | {g(lag)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
