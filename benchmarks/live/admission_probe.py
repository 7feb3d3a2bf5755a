"""Why Ferret skips items ``busy`` where the plain loop keeps up: one Ferret run per rate (MNIST/MNISTNet,
the side-by-side's harness) with the admission log at DEBUG (logger ``ferret.admission``: every busy skip
with its expected wait, W, the queue's length and K, and the measured service time it was judged by).

    /work/tools/timed .venv/bin/python -m benchmarks.live.admission_probe     # → results/admission_probe.json
"""

from __future__ import annotations

import glob
import json
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.live import side_by_side as sbs
from ferret_core.data import load_dataset
from services.config.data_root import default_data_root
from services.localstack import LocalStack

BUSY = re.compile(
    r"busy \(([^)]*)\): worker \d+, event time [\d.]+ s, wait ([\d.]+) s vs W ([\d.inf]+) s, "
    r"queue (\d+) vs K (\d+), service ([\d.]+) s"
)
RATES = (72.28, 144.55)  # 0.25× and 0.5× of the side-by-side's measured saturation (289/s)
ITEMS = 600


def _debug_popen(real: Any) -> Any:
    def popen(args: Any, *a: Any, **k: Any) -> Any:
        if isinstance(args, list) and "run" in args and "--log-level" in args:
            args = ["DEBUG" if x == "WARNING" else x for x in args]
        return real(args, *a, **k)

    return popen


def main() -> int:
    sbs.h.subprocess.Popen = _debug_popen(subprocess.Popen)  # the trainer logs at DEBUG
    dataset = load_dataset("mnist", default_data_root())
    stack = sbs.SharedStack(LocalStack().start())
    sbs.h.LocalStack = lambda: stack  # type: ignore[assignment,misc]
    rows = []
    try:
        for rate in RATES:
            before = set(glob.glob("/tmp/ferret-svc-bench-*"))
            r = sbs.run_ferret(dataset, "mnist", "mnistnet", "ferret", None, rate, ITEMS)
            logs = sorted(set(glob.glob("/tmp/ferret-svc-bench-*")) - before)
            text = "".join(Path(p).read_text(errors="replace") for d in logs for p in glob.glob(d + "/*.log"))
            busy = BUSY.findall(text)
            service = [1000 * float(b[5]) for b in busy]
            rows.append({
                "rate": rate, "interval_ms": 1000 / rate, "items": ITEMS, "trained_pct": r["trained_pct"],
                "skipped": r["skipped"], "trainer_cores": r["trainer_cores"], "busy_logged": len(busy),
                "why": {w: sum(1 for b in busy if b[0] == w) for w in sorted({b[0] for b in busy})},
                "service_ms_median": statistics.median(service) if service else None,
                "service_ms_min": min(service, default=None), "service_ms_max": max(service, default=None),
                "W_ms": 1000 * float(busy[0][2]) if busy else None, "K": int(busy[0][4]) if busy else None,
                "load_average": sbs.h.load_average(),
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    finally:
        stack._stack.stop()
    payload = {"command": "python -m benchmarks.live.admission_probe", "commit": sbs.h.git_head(), "rows": rows}
    (sbs.RESULTS / "admission_probe.json").write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
