"""What the guard costs per item, end to end: the arms of :mod:`guard_bench` (``unguarded``,
``norm-only``, ``guard``) on the same 500-item MNIST/MNISTNet stream (seed 0, no burst within it), each
run twice in turn; the best of the two, as seconds per 1,000 items and as a ratio to ``unguarded``.

    flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.guard.guard_overhead
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.guard import guard_bench
from benchmarks.support import short_head

ARMS = ("unguarded", "norm-only", "guard")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = short_head()
    data = guard_bench.stream(0, args.items, "fuzz", 10 * args.items, 0)  # the burst lies beyond the stream
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    shadow_ms: dict[str, float] = {}
    for _ in range(args.repeats):
        for arm in ARMS:
            r = guard_bench.run("fuzz", arm, 0, data, 0.01)
            seconds[arm].append(1e3 * r.seconds / len(r.correct))
            shadow_ms[arm] = r.shadow_ms
    base = min(seconds["unguarded"])
    print(f"# Guard overhead (commit {commit}): {args.items} items, best of {args.repeats}, torch threads 1\n")
    print("| arm | s per 1,000 items (runs) | best | × unguarded | shadow ms / compared item (last run) |")
    print("|---|---|---|---|---|")
    for arm in ARMS:
        runs = " / ".join(f"{s:.2f}" for s in seconds[arm])
        best = min(seconds[arm])
        print(f"| {arm} | {runs} | {best:.2f} | {best / base:.2f} | {shadow_ms[arm]:.2f} |")


if __name__ == "__main__":
    main()
