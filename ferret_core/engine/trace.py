"""Checks on the *executed* trace, a readable step × executor table, staleness statistics, CSV round trip.

The validator (STYLE lesson 3–4, after ``torch.distributed.pipelining``'s ``_validate_schedule``) checks,
in the order the events were recorded:

* every B (and R) of an (item, stage) comes after that pair's F, and reads the version its F read
  (the stash); R comes before its B;
* dependencies: F at j starts after the item's F at j−1 ended; B at j < P−1 after its B at j+1;
* a worker's F reads its current replica: the version its own last U of that stage wrote (0 before);
* each stage's U events write consecutive master versions 1, 2, 3, …, each from the version before;
* no executor runs two actions at once (checked by time, so on the virtual clock exactly);
* each applied gradient's staleness τ = (master version at its U) − (version its B read) is at most
  ``bounds[stage]`` (:func:`ferret_core.staleness.staleness_bound` of the plan).

On failure :class:`TraceError` carries the violations and the table around the first one, its step
marked ``>>`` and its cell ``*``.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ferret_core.engine.actions import Kind, TraceEvent
from ferret_core.errors import FerretError
from ferret_core.plan import Plan
from ferret_core.staleness import staleness_bound

_EPS = 1e-9


class TraceError(FerretError, AssertionError):
    """An executed trace broke a schedule invariant; the message holds the marked table."""

    def __init__(self, violations: Sequence[Violation], table: str) -> None:
        self.violations = tuple(violations)
        self.table = table
        head = "\n".join(f"  event {v.index}: {v.message}" for v in self.violations[:10])
        more = f"\n  … and {len(self.violations) - 10} more" if len(self.violations) > 10 else ""
        super().__init__(f"{len(self.violations)} trace violation(s):\n{head}{more}\n\n{table}")


@dataclass(frozen=True)
class Violation:
    index: int  # position of the offending event in the trace
    message: str


def plan_bounds(plan: Plan) -> tuple[int, ...]:
    return tuple(staleness_bound(plan, j) for j in range(plan.num_stages))


def check_trace(
    trace: Sequence[TraceEvent], num_stages: int, bounds: Sequence[int] | None = None
) -> list[Violation]:
    """Every violation of the invariants in the module docstring (empty when the trace is valid)."""
    out: list[Violation] = []
    fwd: dict[tuple[int, int], TraceEvent] = {}
    bwd: dict[tuple[int, int], TraceEvent] = {}
    rec: dict[tuple[int, int], TraceEvent] = {}
    replica: dict[tuple[int, int], int] = defaultdict(int)
    master: dict[int, int] = defaultdict(int)
    pending: dict[tuple[int, int], list[TraceEvent]] = defaultdict(list)
    for i, e in enumerate(trace):
        key = (e.item, e.stage)
        if e.kind is Kind.F:
            if key in fwd:
                out.append(Violation(i, f"second F of item {e.item} at stage {e.stage}"))
            fwd[key] = e
            if e.stage > 0:
                below = fwd.get((e.item, e.stage - 1))
                if below is None or e.start < below.end - _EPS:
                    out.append(Violation(i, f"F{e.item} at stage {e.stage} before its F at stage {e.stage - 1}"))
            if e.version_read != replica[e.executor]:
                out.append(
                    Violation(
                        i,
                        f"F{e.item} on {_name(e.executor)} read version {e.version_read}, but the worker's "
                        f"replica is at version {replica[e.executor]}",
                    )
                )
        elif e.kind in (Kind.R, Kind.B):
            f = fwd.get(key)
            if f is None or e.start < f.end - _EPS:
                out.append(Violation(i, f"{e.kind}{e.item} at stage {e.stage} before its F"))
            elif e.version_read != f.version_read:
                out.append(
                    Violation(i, f"{e.kind}{e.item} at stage {e.stage} read version {e.version_read}, "
                              f"its F read {f.version_read} (stash broken)")
                )
            if e.kind is Kind.R:
                rec[key] = e
                continue
            r = rec.get(key)
            if r is not None and e.start < r.end - _EPS:
                out.append(Violation(i, f"B{e.item} at stage {e.stage} before its R ended"))
            if e.stage < num_stages - 1:
                above = bwd.get((e.item, e.stage + 1))
                if above is None or e.start < above.end - _EPS:
                    out.append(Violation(i, f"B{e.item} at stage {e.stage} before its B at stage {e.stage + 1}"))
            bwd[key] = e
            pending[e.executor].append(e)
        else:
            if e.version_written != e.version_read + 1 or e.version_read != master[e.stage]:
                out.append(
                    Violation(
                        i,
                        f"U at stage {e.stage} went {e.version_read}→{e.version_written}; the master was at "
                        f"{master[e.stage]}",
                    )
                )
            master[e.stage] = e.version_written if e.version_written is not None else master[e.stage]
            replica[e.executor] = master[e.stage]
            for b in pending.pop(e.executor, []):
                tau = e.version_read - b.version_read
                if bounds is not None and tau > bounds[e.stage]:
                    out.append(
                        Violation(
                            i,
                            f"staleness {tau} of B{b.item}'s gradient at stage {e.stage} exceeds the bound "
                            f"{bounds[e.stage]} (read version {b.version_read}, applied at {e.version_read})",
                        )
                    )
    out.extend(_overlaps(trace))
    out.sort(key=lambda v: v.index)
    return out


def _overlaps(trace: Sequence[TraceEvent]) -> list[Violation]:
    out = []
    by_executor: dict[tuple[int, int], list[tuple[int, TraceEvent]]] = defaultdict(list)
    for i, e in enumerate(trace):
        if e.kind is not Kind.U:
            by_executor[e.executor].append((i, e))
    for events in by_executor.values():
        events.sort(key=lambda pair: (pair[1].start, pair[0]))
        for (_, prev), (i, e) in itertools.pairwise(events):
            if e.start < prev.end - _EPS:
                out.append(
                    Violation(i, f"{_name(e.executor)} runs {e} from {e.start:g} while {prev} runs until {prev.end:g}")
                )
    return out


def validate_trace(trace: Sequence[TraceEvent], plan: Plan, *, check_staleness: bool = True) -> None:
    """Raise :class:`TraceError` (with the marked table) unless ``trace`` satisfies every invariant."""
    bounds = plan_bounds(plan) if check_staleness else None
    violations = check_trace(trace, plan.num_stages, bounds)
    if violations:
        raise TraceError(violations, format_table(trace, mark=violations[0].index))


def format_table(trace: Sequence[TraceEvent], *, mark: int | None = None, window: int = 8) -> str:
    """Steps (distinct start times) × executors; cells list the events that start there, a ``U`` in the
    cell of the B before it (``B7+U``). The step of event ``mark`` is shown ``>>`` with the event ``*``-prefixed, and
    only ``window`` steps either side of it."""
    if not trace:
        return "(empty trace)"
    executors = sorted({e.executor for e in trace})
    steps = sorted({e.start for e in trace if e.kind is not Kind.U})
    row_of = {t: r for r, t in enumerate(steps)}
    cells: dict[tuple[int, tuple[int, int]], list[str]] = defaultdict(list)
    last_row: dict[tuple[int, int], int] = {}
    rows: list[int] = []
    for i, e in enumerate(trace):
        row = last_row.get(e.executor, 0) if e.kind is Kind.U else row_of[e.start]
        last_row[e.executor] = row
        rows.append(row)
        text = ("*" if i == mark else "") + (f"{e.kind}{e.item}" if e.kind is not Kind.U else "U")
        cells[(row, e.executor)].append(text)
    marked_row = rows[mark] if mark is not None else None
    lo, hi = 0, len(steps)
    if marked_row is not None:
        lo, hi = max(0, marked_row - window), min(len(steps), marked_row + window + 1)
    width = max(6, *(len("+".join(v)) for v in cells.values()))
    header = "   step      time  " + " ".join(f"{_name(x):>{width}}" for x in executors)
    lines = [header, "-" * len(header)]
    for r in range(lo, hi):
        flag = ">>" if r == marked_row else "  "
        line = " ".join(f"{'+'.join(cells.get((r, x), ['.'])):>{width}}" for x in executors)
        lines.append(f"{flag}{r:>5} {steps[r]:>9.4g}  {line}")
    if lo > 0 or hi < len(steps):
        lines.append(f"(steps {lo}–{hi - 1} of {len(steps)})")
    return "\n".join(lines)


def staleness_by_stage(trace: Iterable[TraceEvent], num_stages: int) -> list[list[int]]:
    """τ of every applied gradient, per stage, in application order."""
    out: list[list[int]] = [[] for _ in range(num_stages)]
    pending: dict[tuple[int, int], list[int]] = defaultdict(list)
    for e in trace:
        if e.kind is Kind.B:
            pending[e.executor].append(e.version_read)
        elif e.kind is Kind.U:
            out[e.stage].extend(e.version_read - v for v in pending.pop(e.executor, []))
    return out


def mean_staleness(trace: Iterable[TraceEvent], num_stages: int) -> tuple[float, ...]:
    return tuple(sum(s) / len(s) if s else 0.0 for s in staleness_by_stage(trace, num_stages))


_FIELDS = ("kind", "worker", "stage", "item", "version_read", "version_written", "start", "end")


def to_csv(trace: Iterable[TraceEvent]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(_FIELDS)
    for e in trace:
        writer.writerow(
            [e.kind.value, e.worker, e.stage, e.item, e.version_read,
             "" if e.version_written is None else e.version_written, repr(e.start), repr(e.end)]
        )
    return buf.getvalue()


def from_csv(text: str) -> list[TraceEvent]:
    rows = csv.DictReader(io.StringIO(text))
    return [
        TraceEvent(
            Kind(r["kind"]), int(r["worker"]), int(r["stage"]), int(r["item"]), int(r["version_read"]),
            None if r["version_written"] == "" else int(r["version_written"]), float(r["start"]), float(r["end"]),
        )
        for r in rows
    ]


def _name(executor: tuple[int, int]) -> str:
    return f"w{executor[0]}s{executor[1]}"
