"""Exhaustive cross-check of Alg. 2's greedy against the best configuration on small cases.

For random profiles of 2–4 units, every partition with P ≤ 3 and N ≤ 2 worker slots, and c^r ∈ {0, 1},
enumerate every configuration (per worker: live or removed; per stage j ≤ P−2: c^a ∈ 1..P−j−1 with
c^o = 0, or c^a = 1 with c^o = P−1−j; at least one live worker) and compare, at budgets across the
feasible range, the greedy's R_F with the best R_F that fits. Both memory models (eq. ferret-svre in
elements, and the default bytes with extras) are checked. Writes results/exhaustive.{md,json}.

    .venv/bin/python -m benchmarks.planner.exhaustive
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

from ferret_core.plan import WorkerConfig
from ferret_core.planning.cost_model import RateModel, StageGeometry, num_worker_slots
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.partitioning import candidate_partitions
from ferret_core.planning.search import search_path
from ferret_core.profile import LayerProfile, ModelProfile

RESULTS = Path(__file__).resolve().parent / "results"
CASES = 300
BUDGETS_PER_CASE = 8
SEED = 2025


def stage_options(p: int, j: int) -> list[tuple[int, int]]:
    if j == p - 1:
        return [(1, 0)]
    return [(a, 0) for a in range(1, p - j)] + [(1, p - 1 - j)]


def all_configs(p: int, n: int, recompute: bool) -> list[tuple[WorkerConfig, ...]]:
    per_worker: list[list[WorkerConfig | None]] = []
    for index in range(n):
        options: list[WorkerConfig | None] = [None]
        for combo in itertools.product(*(stage_options(p, j) for j in range(p))):
            acc = tuple(a for a, _ in combo)
            om = tuple(o for _, o in combo)
            options.append(WorkerConfig(index, True, recompute, acc, om))
        per_worker.append(options)
    out = []
    for combo in itertools.product(*per_worker):
        if all(w is None for w in combo):
            continue
        workers = tuple(
            w if w is not None else WorkerConfig(i, False, recompute, (1,) * p, (0,) * p) for i, w in enumerate(combo)
        )
        out.append(workers)
    return out


def random_profile(rng: random.Random) -> ModelProfile:
    units = rng.randint(2, 4)
    layers = tuple(
        LayerProfile(
            f"u{i}", rng.uniform(0.2, 3.0), rng.uniform(0.2, 6.0), rng.randint(10, 200_000), rng.randint(10, 20_000)
        )
        for i in range(units)
    )
    return ModelProfile("random", (rng.randint(1, 3000),), layers)


def check(settings: MemorySettings, rng: random.Random) -> dict[str, object]:
    compared = losses = greedy_infeasible = 0
    worst = 0.0
    rel_losses: list[float] = []
    examples: list[dict[str, object]] = []
    while compared < CASES * BUDGETS_PER_CASE:
        profile = random_profile(rng)
        decay = rng.choice([0.01, 0.1, 0.5])
        arrival = rng.uniform(0.6, 2.0) * profile.max_forward_time
        for _, partition in candidate_partitions(profile):
            if partition.num_stages > 3:
                continue
            geometry = StageGeometry.from_profile(profile, partition)
            rate_model = RateModel(geometry, decay)
            memory = MemoryModel(geometry, profile, settings)
            for recompute in (False, True):
                n = num_worker_slots(geometry, arrival, recompute)
                if n > 2:
                    continue
                configs = [
                    (
                        sum(rate_model.worker_rate(w.recompute, w.accumulation, w.omission) for w in ws if w.live),
                        memory.total(ws),
                    )
                    for ws in all_configs(partition.num_stages, n, recompute)
                ]
                path = search_path(rate_model, memory, n, recompute)
                low = min(m for _, m in configs)
                high = max(m for _, m in configs)
                for _ in range(BUDGETS_PER_CASE):
                    budget = int(rng.uniform(low, high * 1.05))
                    best = max((r for r, m in configs if m <= budget), default=None)
                    point = path.first_within(budget)
                    if best is None:
                        continue
                    compared += 1
                    if point is None:
                        greedy_infeasible += 1
                        continue
                    gap = (best - point.rate) / best
                    if gap > 1e-12:
                        losses += 1
                        rel_losses.append(gap)
                        worst = max(worst, gap)
                        if len(examples) < 5:
                            examples.append(
                                {
                                    "partition": partition.boundaries,
                                    "N": n,
                                    "recompute": recompute,
                                    "budget": budget,
                                    "greedy_rate": point.rate,
                                    "best_rate": best,
                                }
                            )
    return {
        "memory_model": "paper elements" if settings.count_elements else f"{settings.variant} bytes + extras",
        "comparisons": compared,
        "greedy_below_optimum": losses,
        "greedy_infeasible_where_optimum_fits": greedy_infeasible,
        "loss_rate": losses / compared,
        "mean_relative_loss_when_losing": sum(rel_losses) / len(rel_losses) if rel_losses else 0.0,
        "worst_relative_loss": worst,
        "examples": examples,
    }


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    rows = [
        check(s, rng)
        for s in (  # compensator pinned to what the committed results counted (the default before issue 13)
            MemorySettings.paper_elements(),
            MemorySettings(compensator="iter-fisher"),
            MemorySettings(variant="engine", compensator="iter-fisher"),
        )
    ]
    lines = [
        "| memory model | comparisons | greedy < optimum | greedy infeasible, optimum fits | "
        "mean relative loss when losing | worst relative loss |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['memory_model']} | {r['comparisons']} | {r['greedy_below_optimum']} ({r['loss_rate']:.1%}) | "
            f"{r['greedy_infeasible_where_optimum_fits']} | {r['mean_relative_loss_when_losing']:.2%} | "
            f"{r['worst_relative_loss']:.2%} |"
        )
    table = "\n".join(lines)
    print(table)
    (RESULTS / "exhaustive.md").write_text(
        f"Alg. 2's greedy versus exhaustive search (P ≤ 3, N ≤ 2, seed {SEED}, {CASES} × {BUDGETS_PER_CASE} "
        "budget comparisons per memory model; one partition and c^r at a time).\n\n" + table + "\n"
    )
    (RESULTS / "exhaustive.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
