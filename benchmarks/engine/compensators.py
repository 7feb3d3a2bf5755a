"""Compensators on one fixed plan (issue 11): Iter-Fisher vs its lean form vs Fisher vs none.

MNISTNet on MNIST (committed profile, virtual clock at the paper's rate t^d = max t̂^f, SGD lr 1e-3).
The plans are made once with ``compensator="none"`` (so no compensator's state shapes the pipeline) —
the unconstrained plan and the plan at 2/3 of the way from the minimum feasible budget — and every
compensator runs on each of them (:func:`ferret_core.engine.ablation.run_compensators`) for ``--seeds``
seeds (a seed sets the initial weights and shuffles the stream). Reported: online and test accuracy
(mean ± standard error over seeds), relative correction ‖g_out − g‖/‖g‖ per stage and the final λ,
the compensator's state bytes (measured) and the engine's measured peak.

A second table checks, on the gradients and master deltas of a real run (Iter-Fisher on the
unconstrained plan), that the one-step form differs from the iterated one at second order in
λ·g⊙g⊙Δθ: for every 10th compensated call with τ ≥ 2, both forms are recomputed in float64 with λ
scaled by 1, 10, 100 and 1000; the difference grows as λ² while the correction grows as λ.

    .venv/bin/python -m benchmarks.engine.compensators --items 3000 --seeds 5   # → results/compensators.{md,json}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from ferret_core.compensation.fisher import fisher_step
from ferret_core.compensation.iter_fisher import IterFisherCompensator
from ferret_core.data import iter_stream, load_dataset, test_split
from ferret_core.engine import EngineSettings, FerretPolicy, StageTimes, StreamEngine
from ferret_core.engine.ablation import AblationRun, RunInputs, run_compensators
from ferret_core.plan import Plan
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from ferret_core.zoo import build_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results"
PROFILE = HERE.parent / "profiles" / "mnistnet.json"
COMPENSATORS = ("none", "fisher", "iter-fisher-lean", "iter-fisher")
LAMBDA_SCALES = (1.0, 10.0, 100.0, 1000.0)


def plans(profile: ModelProfile) -> dict[str, Plan]:
    memory = MemorySettings(in_flight="schedule", compensator="none")
    planner = Planner(profile, PlannerSettings(memory=memory))
    low, high = planner.min_feasible_bytes, planner.plan(None).planned_bytes
    return {"unconstrained": planner.plan(None), "2/3 budget": planner.plan(int(low + 2 / 3 * (high - low)))}


def describe(plan: Plan) -> str:
    return f"{plan.num_stages} stage(s) × {plan.live_workers} of {plan.num_workers} workers"


class _Paired(IterFisherCompensator):
    """Iter-Fisher that, on every 10th call with τ ≥ 2, also evaluates both forms in float64 with λ
    scaled (the engine still applies Iter-Fisher's own output)."""

    rows: list[dict[str, float]]

    def _compensate(
        self, grads: list[Tensor], staleness: int, theta_then: Sequence[Tensor], theta_now: Sequence[Tensor]
    ) -> list[Tensor]:
        out = super()._compensate(grads, staleness, theta_then, theta_now)
        self._calls_seen = getattr(self, "_calls_seen", 0) + 1
        deltas = self.ring.recent(staleness)
        if staleness >= 2 and len(deltas) == staleness and self._calls_seen % 10 == 0:
            g = [t.double() for t in grads]
            gap = [(n.double() - t.double()) for n, t in zip(theta_now, theta_then, strict=True)]
            norm_g = _norm(g)
            lam = float(self._lam) if not isinstance(self._lam, Tensor) else float(self._lam.item())
            for scale in LAMBDA_SCALES:
                iterated = [t.clone() for t in g]
                for delta in deltas:
                    iterated = fisher_step(iterated, [d.double() for d in delta], lam * scale)
                lean = fisher_step(g, gap, lam * scale)
                correction = _norm([a - b for a, b in zip(iterated, g, strict=True)]) / norm_g
                difference = _norm([a - b for a, b in zip(lean, iterated, strict=True)]) / norm_g
                self.rows.append({"scale": scale, "tau": staleness, "correction": correction, "difference": difference})
        return out


def _norm(ts: Sequence[Tensor]) -> float:
    return math.sqrt(sum(float((t * t).sum()) for t in ts))


def second_order_table(plan: Plan, profile: ModelProfile, items: int) -> list[dict[str, float]]:
    ds = load_dataset("mnist", ROOT.parent / "shared" / "data", seed=0)
    model = build_model("mnistnet", seed=0)
    settings = EngineSettings(compensator="iter-fisher", keep_trace=False, validate=False, measure_memory=False)
    engine = StreamEngine(
        model.units, FerretPolicy(plan).setup("mnistnet", model.num_units, plan.arrival_interval), settings
    )
    rows: list[dict[str, float]] = []
    paired = []
    for old in engine.pipeline.compensators:
        assert isinstance(old, IterFisherCompensator)
        fresh = _Paired(_like(old), old.settings, old.ring.capacity)
        fresh.rows = rows
        paired.append(fresh)
    engine.pipeline.compensators = tuple(paired)
    engine.run_virtual(
        iter_stream(ds, limit=items), StageTimes.from_profile(profile, plan.partition), plan.arrival_interval
    )
    table = []
    for scale in LAMBDA_SCALES:
        picked = [r for r in rows if r["scale"] == scale]
        corr = statistics.median(r["correction"] for r in picked)
        diff = statistics.median(r["difference"] for r in picked)
        ratio = statistics.median(r["difference"] / r["correction"] ** 2 for r in picked if r["correction"] > 0)
        table.append(
            {
                "lambda_scale": scale,
                "calls": len(picked),
                "median_correction": corr,
                "median_difference": diff,
                "median_difference_over_correction_squared": ratio,
            }
        )
    return table


def _like(comp: IterFisherCompensator) -> list[Tensor]:
    return [torch.zeros(s, dtype=d) for s, d in zip(comp._shapes, comp._dtypes, strict=True)]


def summary(runs: list[AblationRun]) -> list[dict[str, object]]:
    out = []
    for name in COMPENSATORS:
        mine = [r for r in runs if r.compensator == name]
        oacc = [r.result.oacc for r in mine]
        tacc = [r.result.tacc or 0.0 for r in mine]
        stages = len(mine[0].result.relative_correction)
        out.append(
            {
                "compensator": name,
                "seeds": len(mine),
                "oacc_mean": statistics.fmean(oacc),
                "oacc_se": statistics.stdev(oacc) / math.sqrt(len(oacc)) if len(oacc) > 1 else 0.0,
                "tacc_mean": statistics.fmean(tacc),
                "tacc_se": statistics.stdev(tacc) / math.sqrt(len(tacc)) if len(tacc) > 1 else 0.0,
                "relative_correction": [
                    statistics.fmean(r.result.relative_correction[j] for r in mine) for j in range(stages)
                ],
                "lambda": [statistics.fmean((r.result.lambdas[j] or math.nan) for r in mine) for j in range(stages)],
                "state_bytes": max(r.state_bytes for r in mine),
                "peak_bytes": max(r.result.peak_bytes or 0 for r in mine),
                "mean_staleness": [statistics.fmean(r.result.mean_staleness[j] for r in mine) for j in range(stages)],
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--test-items", type=int, default=10000, help="held-out items for test accuracy")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    load_before = os.getloadavg()[0]
    profile = ModelProfile.load(PROFILE)
    ds = load_dataset("mnist", ROOT.parent / "shared" / "data", seed=0)
    x_test, y_test = test_split(ds)
    test = (x_test[: args.test_items], y_test[: args.test_items])

    def make_run(seed: int) -> RunInputs:
        model = build_model("mnistnet", seed=seed)
        return model.units, iter_stream(ds, limit=args.items, iid=True, seed=seed), test

    started = time.perf_counter()
    results: dict[str, object] = {}
    lines = []
    for label, plan in plans(profile).items():
        settings = EngineSettings(keep_trace=False, validate=False)
        runs = run_compensators(plan, profile, COMPENSATORS, list(range(args.seeds)), make_run, settings)
        print(f"{label}: {len(runs)} runs done at {time.perf_counter() - started:.0f} s", file=sys.stderr)
        rows = summary(runs)
        results[label] = {"plan": plan.to_dict(), "summary": rows}
        lines += [
            f"**{label}** plan ({describe(plan)}, planned with compensator none, "
            f"{plan.planned_bytes / 2**20:.2f} MiB without compensator state):",
            "",
            "| compensator | oacc % (mean ± s.e.) | tacc % (mean ± s.e.) | relative correction per stage "
            "| λ per stage | mean τ per stage | state MiB | measured peak MiB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            fmt = ", ".join
            lines.append(
                f"| {r['compensator']} | {r['oacc_mean']:.2f} ± {r['oacc_se']:.2f} | {r['tacc_mean']:.2f} ± "
                f"{r['tacc_se']:.2f} | {fmt(f'{c:.2e}' for c in r['relative_correction'])} | "  # type: ignore[attr-defined]
                f"{fmt(f'{v:.7g}' for v in r['lambda'])} | "  # type: ignore[attr-defined]
                f"{fmt(f'{v:.2f}' for v in r['mean_staleness'])} | "  # type: ignore[attr-defined]
                f"{r['state_bytes'] / 2**20:.2f} | {r['peak_bytes'] / 2**20:.2f} |"  # type: ignore[operator]
            )
        lines.append("")
    unconstrained = plans(profile)["unconstrained"]
    order = second_order_table(unconstrained, profile, min(args.items, 1500))
    results["second_order"] = order
    lines += [
        "**One step vs the iteration** on real gradients (Iter-Fisher run, unconstrained plan; every 10th "
        "call with τ ≥ 2, float64):",
        "",
        "| λ × | calls | median ‖g_iter − g‖/‖g‖ | median ‖g_lean − g_iter‖/‖g‖ | median difference ÷ correction² |",
        "|---|---|---|---|---|",
    ]
    for r in order:
        lines.append(
            f"| {r['lambda_scale']:g} | {r['calls']:.0f} | {r['median_correction']:.3e} | "
            f"{r['median_difference']:.3e} | {r['median_difference_over_correction_squared']:.3g} |"
        )
    command = (
        f".venv/bin/python -m benchmarks.engine.compensators --items {args.items} --seeds {args.seeds} "
        f"--test-items {args.test_items}"
    )
    header = (
        f"Compensators on fixed plans, MNISTNet / MNIST, {args.items} items per run (stream shuffled by the "
        f"seed), {args.seeds} seeds, test accuracy on the first {args.test_items} test items, "
        f"virtual clock (load average {load_before:.2f} → "
        f"{os.getloadavg()[0]:.2f}, {time.perf_counter() - started:.0f} s). Command: `{command}`.\n\n"
    )
    text = header + "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compensators.md").write_text(text)
    (RESULTS / "compensators.json").write_text(json.dumps({"command": command, **results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
