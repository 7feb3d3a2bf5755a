"""What-if: B-Skip and Camel against 1-Skip when a mini-batch step costs little more than one item's.

On this CPU (one torch thread) a 10-item step of MNISTNet costs 6.2x a 1-item step
(``benchmarks/profiles/mnistnet-batches.json``), and the buffering methods fall below 1-Skip
(``results/methods.md``). The paper ran on GPUs, where a small mini-batch costs about as much as one item.
This run keeps everything of the methods table (5000 ``split-mnist`` items, MNISTNet, t^d = max_i t̂_i^f
of the measured 1-item profile, lr 1e-3, seed 0) and changes only the mini-batch step times: a *derived*
profile whose step of b items costs t(1)·(1 + k·(b − 1)) per unit, k set so that a 10-item step costs
``--cost-of-10`` times one item (default 1.5). The derived times are an assumption, not a measurement of
any GPU; the accuracies and memory each run reports are measured on the engine as usual.

    .venv/bin/python -m benchmarks.methods.cheap_batches      # → results/cheap_batches.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ferret_core.metrics import agm, tagm
from ferret_core.profile import LayerProfile, ModelProfile

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
MEASURED = ROOT / "benchmarks/profiles/mnistnet-batches.json"
METHODS = ("1-skip", "random-n", "last-n", "camel")
SIZES = (10, 20, 50)


def derived_profile(cost_of_10: float) -> ModelProfile:
    """The measured profile with step times t(1)·(1 + k·(b − 1)) for b in :data:`SIZES`."""
    measured = ModelProfile.load(MEASURED)
    k = (cost_of_10 - 1.0) / 9.0
    layers = tuple(
        LayerProfile(layer.name, layer.t_f, layer.t_b, layer.params, layer.activations, layer.saved,
                     tuple((b, layer.t_f * (1 + k * (b - 1)), layer.t_b * (1 + k * (b - 1))) for b in SIZES))
        for layer in measured.layers
    )
    meta = {**measured.meta, "derived": f"what-if: a 10-item step costs {cost_of_10}x one item's (cheap_batches.py)"}
    return ModelProfile(measured.model, measured.input_shape, layers, measured.device, measured.dtype,
                        measured.time_unit, meta)


def run(method: str, profile: Path, items: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "services.cli.main", "simulate", "--dataset", "split-mnist", "--model", "mnistnet",
           "--method", method, "--items", str(items), "--profile", str(profile), "--json"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    report: dict[str, Any] = json.loads(done.stdout)
    report["command"] = " ".join(["ferret", *cmd[3:]])
    print(f"{method:<9} oacc {report['oacc']:6.2f} tacc {report['tacc']:6.2f} trained {report['trained']}",
          file=sys.stderr, flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--cost-of-10", type=float, default=1.5)
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mnistnet-cheap-batches.json"
        derived_profile(args.cost_of_10).save(path)
        rows = [run(m, path, args.items) for m in METHODS]
    summary = {"items": args.items, "cost_of_10": args.cost_of_10, "rows": rows, "load_average": [*load,
               os.getloadavg()[0]]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cheap_batches.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = table(summary)
    (RESULTS / "cheap_batches.md").write_text(text + "\n")
    print(text)


def table(summary: dict[str, Any]) -> str:
    rows = summary["rows"]
    base = rows[0]
    lines = [
        f"What-if (derived step times: a 10-item step costs {summary['cost_of_10']}x one item's; measured "
        f"profile: 6.2x). split-mnist / mnistnet, {summary['items']} items, lr 1e-3, seed 0; load average "
        + " → ".join(f"{v:.2f}" for v in summary["load_average"]) + ". Command per row in cheap_batches.json.",
        "",
        "| method | oacc % | tacc % | trained | SGD updates | measured peak MiB | agm vs 1-Skip | tagm vs 1-Skip |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['oacc']:.2f} | {r['tacc']:.2f} | {r['trained']} | {sum(map(sum, r['updates']))} | "
            f"{r['peak_bytes'] / 2**20:.2f} | "
            f"{agm(r['oacc'], base['oacc'], r['peak_bytes'], base['peak_bytes']):.2f} | "
            f"{tagm(r['tacc'], base['tacc'], r['peak_bytes'], base['peak_bytes']):.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
