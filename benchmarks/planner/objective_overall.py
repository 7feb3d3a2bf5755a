"""The accuracy objective across `ferret bench overall --preset standard`: Ferret M-, M and M+ on every
setting planned by R_F (``--objective rate``, the paper's) and by R_F discounted by the calibrated cost of
staleness (``--objective accuracy``), 5 seeds, paired (the same seed gives both arms the same weights and
stream; the budgets M and M- are the rate planner's in both). Evidence for issue 24's "the default once it
wins, measured".

The two runs are the bench's own (this script only reads them): each resumes from the committed
`standard-stop30` runs without their Ferret rows, so only Ferret's arms run again, at this checkout's code::

    for o in rate accuracy; do
        mkdir -p out/objstudy/$o/overall
        cp benchmarks/paper/results/standard-stop30/overall/budgets.json out/objstudy/$o/overall/
        awk -F, 'NR==1 || $7!="ferret"' benchmarks/paper/results/standard-stop30/overall/runs.csv \\
            > out/objstudy/$o/overall/runs.csv
        .venv/bin/ferret bench overall --preset standard --jobs 2 --out out/objstudy/$o --resume --objective $o
    done
    .venv/bin/python -m benchmarks.planner.objective_overall out/objstudy/rate out/objstudy/accuracy

Writes ``results/objective_overall.md`` and copies both Ferret row sets to ``results/objective_overall/``.
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
from pathlib import Path

from benchmarks.planner.staleness_objective import cell, mean_se

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BUDGETS = ("M-", "M", "M+")


def ferret_rows(out: Path) -> list[dict[str, str]]:
    with (out / "overall" / "runs.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["method"] == "ferret"]


def oracle_rows(out: Path) -> dict[tuple[str, str], float]:
    with (out / "overall" / "runs.csv").open() as f:
        return {(r["setting"], r["seed"]): float(r["oacc"]) for r in csv.DictReader(f) if r["method"] == "oracle"}


def plans(rows: list[dict[str, str]]) -> str:
    """The plans the seeds ran, as P × live N (``n×`` where several seeds ran the same)."""
    counts: dict[str, int] = {}
    for r in rows:
        key = f"{r['num_stages']} × {r['num_workers']}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(k if n == 1 else f"{k} ({n}×)" for k, n in sorted(counts.items()))


def table(rate: list[dict[str, str]], accuracy: list[dict[str, str]], oracle: dict[tuple[str, str], float]) -> str:
    out = [
        "| setting | budget | Oracle | rate (R_F) | accuracy | accuracy − rate (paired) | s.e.s | "
        "accuracy − Oracle | plans rate | plans accuracy | wall s rate / accuracy |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    wins = losses = ties = 0
    settings = list(dict.fromkeys(r["setting"] for r in rate))
    for setting in settings:
        for budget in BUDGETS:
            a = {r["seed"]: r for r in rate if r["setting"] == setting and r["budget"] == budget}
            b = {r["seed"]: r for r in accuracy if r["setting"] == setting and r["budget"] == budget}
            seeds = sorted(set(a) & set(b), key=int)
            if not seeds:
                continue
            ra, ac = [float(a[s]["oacc"]) for s in seeds], [float(b[s]["oacc"]) for s in seeds]
            diff = [y - x for x, y in zip(ra, ac, strict=True)]
            m, e = mean_se(diff)
            z = m / e if e > 0 else (0.0 if m == 0 else math.copysign(math.inf, m))
            if z > 2:
                wins += 1
            elif z < -2:
                losses += 1
            else:
                ties += 1
            orc = [oracle[(setting, s)] for s in seeds]
            wall = (
                f"{sum(float(a[s]['wall_seconds']) for s in seeds):.0f} / "
                f"{sum(float(b[s]['wall_seconds']) for s in seeds):.0f}"
            )
            out.append(
                f"| {setting} | {budget} | {cell(orc)} | {cell(ra)} | {cell(ac)} | {m:+.2f} ± {e:.2f} | "
                f"{z:+.1f} | {cell([y - o for y, o in zip(ac, orc, strict=True)])} | "
                f"{plans([a[s] for s in seeds])} | {plans([b[s] for s in seeds])} | {wall} |"
            )
    out += ["", f"Cells where accuracy − rate is beyond +2 s.e.: {wins}; beyond −2 s.e.: {losses}; within: {ties}."]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rate", type=Path, help="the --objective rate bench output folder")
    parser.add_argument("accuracy", type=Path, help="the --objective accuracy bench output folder")
    args = parser.parse_args()
    rate, accuracy = ferret_rows(args.rate), ferret_rows(args.accuracy)
    text = "\n".join(
        [
            "# Ferret's arms of `ferret bench overall --preset standard`: the rate vs the accuracy objective",
            "",
            "Online accuracy in % over 5 seeds (mean ± s.e.; differences paired by seed); the Oracle from the "
            "same runs.csv (not re-run: the committed `standard-stop30` rows). `s.e.s` = the paired mean ÷ its "
            "s.e. Plans: P × live N per seed. Wall seconds: the runs' own, summed over seeds (the accuracy "
            "arm's first run per setting includes the calibration; virtual-clock accuracies do not depend on "
            "them). Commands: `benchmarks/planner/objective_overall.py`'s docstring.",
            "",
            table(rate, accuracy, oracle_rows(args.rate)),
        ]
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "objective_overall.md").write_text(text + "\n")
    copies = RESULTS / "objective_overall"
    copies.mkdir(exist_ok=True)
    for name, folder in (("rate", args.rate), ("accuracy", args.accuracy)):
        shutil.copyfile(folder / "overall" / "runs.csv", copies / f"{name}-runs.csv")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
