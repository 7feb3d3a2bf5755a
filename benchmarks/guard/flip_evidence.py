"""How much evidence a flipped-label burst leaves for the rollback test, whatever its threshold.

Runs the ``guard`` arm of :mod:`guard_bench` on the ``flip`` stream with the shadow held at the last
weights promoted before the burst (no promotion from ``--at`` on: what an unbounded probation gives) and
the test never acting (no rollback), records every compared item's (live right, shadow right), then
replays Page's CUSUM of :mod:`services.trainer.guard.cusum` over the records for several θ₁
(``guard.worse_share``) and prints its peak from the burst's start on (the statistic started at 0 there)
and the peak before it (the margin a lower threshold h = ln(1 / ``guard.false_alarm``) would have against
false alarms on this stream).

    nice .venv/bin/python -m benchmarks.guard.flip_evidence --seeds 0 1 2
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

from benchmarks.guard import guard_bench
from benchmarks.support import short_head
from services.trainer.guard.cusum import CusumSettings, DiscordantCusum, Verdict
from services.trainer.guard.learner import GuardedLearner

THETAS = (0.75, 0.9)


def records(seed: int, items: int, at: int, burst: int, lr: float) -> list[tuple[bool, bool]]:
    pairs: list[tuple[bool, bool]] = []
    judged = GuardedLearner._judged

    def observe(self: DiscordantCusum, live_correct: bool, shadow_correct: bool) -> Verdict:
        pairs.append((live_correct, shadow_correct))
        return Verdict.CONTINUE  # record only: never roll back

    def judged_until_the_burst(self: GuardedLearner, item: int, passed: bool, detail: str, suspect: bool) -> None:
        judged(self, item, passed and item < at, detail, suspect)

    data = guard_bench.stream(seed, items, "flip", at, burst)
    with (
        mock.patch.object(DiscordantCusum, "observe", observe),
        mock.patch.object(GuardedLearner, "_judged", judged_until_the_burst),
    ):
        guard_bench.run("flip", "guard", seed, data, lr)
    return pairs


def peak(pairs: list[tuple[bool, bool]], theta: float) -> tuple[float, int]:
    """The CUSUM's largest value over ``pairs`` and the index it was reached at."""
    test = DiscordantCusum(CusumSettings(worse_share=theta))
    best, where = 0.0, -1
    for i, (live, shadow) in enumerate(pairs):
        test.observe(live, shadow)
        if test.statistic > best:
            best, where = test.statistic, i
    return best, where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--items", type=int, default=2600)
    parser.add_argument("--at", type=int, default=1500)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--probation", type=int, default=0, help="guard.probation_items while recording")
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = short_head()
    print(f"# Evidence of a {args.burst}-item label flip at item {args.at} (commit {commit}, lr {args.lr})\n")
    print("| seed | θ₁ | CUSUM peak before the burst (nats) | peak from the burst on (nats) | at item |")
    print("|---|---|---|---|---|")
    with mock.patch.dict(guard_bench.ARMS["guard"], {"FERRET_GUARD_PROBATION_ITEMS": str(args.probation)}):
        for seed in args.seeds:
            pairs = records(seed, args.items, args.at, args.burst, args.lr)  # every item is compared
            for theta in THETAS:
                before, _ = peak(pairs[: args.at], theta)
                after, where = peak(pairs[args.at :], theta)
                print(f"| {seed} | {theta} | {before:.2f} | {after:.2f} | {args.at + where} |", flush=True)
    print("\nh = 9.21 nats at guard.false_alarm 1e-4 (the default), 6.91 at 1e-3, 4.61 at 1e-2.")


if __name__ == "__main__":
    main()
