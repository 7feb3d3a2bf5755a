"""Why Iter-Fisher does not act: the sizes inside Alg. 1 on one stale run, measured call by call.

Runs ``ferret simulate`` in this process on a fixed plan (default: the committed 1 stage × 5 workers MNIST
plan of the standard preset) with a probe in place of the named compensator. For every compensated
gradient (τ > 0) the probe records, on the stage's whole parameter vector:

* ‖g‖, ‖Δθ‖ (θ_now − θ_then), ‖g⊙g⊙Δθ‖ and the applied correction ‖g_τ − g‖ (relative: / ‖g‖);
* the root mean square per element of g and of Δθ (what the elementwise product multiplies);
* for Iter-Fisher's λ (Alg. 1 lines 3–7): ⟨Δv_r, v_a⟩, ‖v_a‖², the gradient of eq. lambda-objective-v1
  in λ and the step η_λ·∇ it takes, and λ itself (λ over time);
* the staleness histogram.

It prints a markdown summary (medians and percentiles over calls) and writes the per-call series as JSON.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.compensation.iter_fisher_scale \
        --compensator iter-fisher --items 250 --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ferret_core.compensation import compensator_registry
from ferret_core.compensation.base import CompensatorSettings, StageCompensator
from ferret_core.compensation.dc_asgd import DcAsgdAdaptiveCompensator
from ferret_core.compensation.fisher import FisherCompensator
from ferret_core.compensation.iter_fisher import IterFisherCompensator
from services.cli.main import main as cli_main

REPO = Path(__file__).resolve().parents[2]
PLAN = REPO / "benchmarks/paper/results/standard/compensation/plans/mnist_mnistnet_M+.json"
RESULTS = Path(__file__).resolve().parent / "results"


def _norm(tensors: Sequence[Tensor]) -> float:
    return float(torch.nn.utils.get_total_norm([t.detach().to(torch.float64) for t in tensors]))


def _rms(tensors: Sequence[Tensor]) -> float:
    count = sum(t.numel() for t in tensors)
    return _norm(tensors) / max(1, count) ** 0.5


class _Probe:
    """Mixed into a compensator: records the sizes of each stale call (host syncs: a diagnostic only)."""

    records: list[dict[str, Any]]

    def _record(
        self, grads: list[Tensor], staleness: int, then: Sequence[Tensor], now: Sequence[Tensor], out: list[Tensor]
    ) -> None:
        gap = list(torch._foreach_sub(list(now), list(then)))
        fisher = list(torch._foreach_mul(list(torch._foreach_mul(grads, grads)), gap))
        g = _norm(grads)
        change = _norm(list(torch._foreach_sub(out, grads)))
        self.records.append(
            {
                "tau": staleness,
                "g": g,
                "gap": _norm(gap),
                "ggd": _norm(fisher),
                "ggd_over_g": _norm(fisher) / g if g else 0.0,
                "correction": change / g if g else 0.0,
                "rms_g": _rms(grads),
                "rms_gap": _rms(gap),
            }
        )

    def _compensate(
        self, grads: list[Tensor], staleness: int, theta_then: Sequence[Tensor], theta_now: Sequence[Tensor]
    ) -> list[Tensor]:
        out: list[Tensor] = super()._compensate(grads, staleness, theta_then, theta_now)  # type: ignore[misc]
        if staleness > 0:
            self._record(grads, staleness, theta_then, theta_now, out)
        return out


class IterFisherProbe(_Probe, IterFisherCompensator):
    """Iter-Fisher (Alg. 1) with its λ step recorded."""

    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings, ring_capacity: int) -> None:
        super().__init__(params, settings, ring_capacity)
        self.records = []
        self._pending: dict[str, float] = {}

    def _update_lambda(self, cross: Tensor, norm_sq: Tensor) -> None:
        lam = float(self._lambda())
        grad = -2.0 * (float(cross) - lam * float(norm_sq)) + 2.0 * self.settings.nu * lam
        self._pending = {
            "cross": float(cross),
            "va_sq": float(norm_sq),
            "lambda_grad": grad,
            "lambda_step": self.settings.eta_lambda * grad,
            "lambda_closed_form": float(cross) / (float(norm_sq) + self.settings.nu) if float(norm_sq) else 0.0,
        }
        super()._update_lambda(cross, norm_sq)

    def _compensate(
        self, grads: list[Tensor], staleness: int, theta_then: Sequence[Tensor], theta_now: Sequence[Tensor]
    ) -> list[Tensor]:
        out = super()._compensate(grads, staleness, theta_then, theta_now)  # the probe's record first
        if staleness > 0:
            self.records[-1].update(self._pending, **{"lambda": self._lambda()})
        return out


class DcAsgdProbe(_Probe, DcAsgdAdaptiveCompensator):
    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings, ring_capacity: int) -> None:
        super().__init__(params, settings, ring_capacity)
        self.records = []


class FisherProbe(_Probe, FisherCompensator):
    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings, ring_capacity: int) -> None:
        super().__init__(params, settings)
        self.records = []


PROBES = {"iter-fisher": IterFisherProbe, "dc-asgd-a": DcAsgdProbe, "fisher": FisherProbe}


def run(
    compensator: str, dataset: str, plan: Path, items: int, seed: int, lr: float, fields: dict[str, float]
) -> list[list[dict[str, Any]]]:
    """The probe's records per stage of one ``ferret simulate`` run (``fields``: CompensatorSettings
    fields replacing the CLI's defaults)."""
    built: list[_Probe] = []
    probe = PROBES[compensator]

    def factory(params: Sequence[Tensor], settings: CompensatorSettings, capacity: int) -> StageCompensator:
        comp = probe(params, dataclasses.replace(settings, **fields), capacity)
        built.append(comp)
        return comp

    saved = compensator_registry._FACTORIES[compensator]
    compensator_registry._FACTORIES[compensator] = factory
    argv = [
        "simulate", "--dataset", dataset, "--profile", str(REPO / "benchmarks/profiles/mnistnet-batches.json"),
        "--method", "ferret", "--plan", str(plan), "--items", str(items), "--seed", str(seed), "--lr", f"{lr:g}",
        "--compensator", compensator, "--test-items", "100", "--json",
    ]  # fmt: skip
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            cli_main(argv)
    finally:
        compensator_registry._FACTORIES[compensator] = saved
    return [p.records for p in built]


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(records: list[dict[str, Any]]) -> list[str]:
    keys = [k for k in records[0] if k != "tau"] if records else []
    lines = ["| quantity | median | p10 | p90 | max |", "|---|---:|---:|---:|---:|"]
    for key in keys:
        values = [float(r[key]) for r in records if key in r]
        lines.append(
            f"| {key} | {statistics.median(values):.3g} | {_q(values, 0.1):.3g} | {_q(values, 0.9):.3g} | "
            f"{max(values):.3g} |"
        )
    hist = Counter(int(r["tau"]) for r in records)
    lines += ["", "staleness histogram (compensated calls): " + ", ".join(f"τ={k}: {hist[k]}" for k in sorted(hist))]
    if records and "lambda" in records[0]:
        marks = [records[int(f * (len(records) - 1))]["lambda"] for f in (0, 0.25, 0.5, 0.75, 1.0)]
        lines.append("λ at 0, 25, 50, 75, 100 % of the calls: " + ", ".join(f"{v:.9g}" for v in marks))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compensator", choices=sorted(PROBES), default="iter-fisher")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--plan", type=Path, default=PLAN)
    parser.add_argument("--items", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a CompensatorSettings field")
    args = parser.parse_args()
    fields = {k: float(v) for k, _, v in (item.partition("=") for item in args.set)}
    torch.set_num_threads(1)
    stages = run(args.compensator, args.dataset, args.plan, args.items, args.seed, args.lr, fields)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    settings = dataclasses.replace(CompensatorSettings(), **fields)
    lines = [f"`{args.compensator}` on {args.dataset}, plan {args.plan.name}, {args.items} items, seed {args.seed}, "
             f"lr {args.lr:g}; {settings}", "",
             f"Command: `python -m benchmarks.compensation.iter_fisher_scale {' '.join(sys.argv[1:])}` "
             f"(commit {commit})"]
    for j, records in enumerate(stages):
        lines += ["", f"stage {j}: {len(records)} compensated calls", ""]
        lines += summary(records) if records else ["(no stale gradient)"]
    print("\n".join(lines))
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "".join(f"_{k}{v:g}" for k, v in fields.items())
    name = f"scale_{args.compensator}{suffix}_{args.dataset}_s{args.seed}"
    (RESULTS / f"{name}.json").write_text(json.dumps(stages, separators=(",", ":")) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
