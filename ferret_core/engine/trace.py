"""Checks on the *executed* trace, a readable step × executor table, staleness statistics, CSV round trip.

The validator (STYLE lesson 3–4, after ``torch.distributed.pipelining``'s ``_validate_schedule``) checks,
in the order the events were recorded:

* every B, W (and R) of an (item, stage) comes after that pair's F, and reads the version its F read
  (the stash); R comes before its B (or, where the stage has no B, its W);
* dependencies: F at j starts after the item's F at j−1 ended; B at j < P−1 after its B at j+1; a split
  backward's W (zero bubble) after its own B, or — at the item's lowest stage, which has no B — after
  the B at j+1;
* a worker's F reads its current replica: the version its own last U of that stage wrote (0 before);
  under :attr:`TraceSemantics.shared_updates` (a synchronous flush) every U of a stage refreshes every
  worker, so an F reads the stage's latest version;
* an F reading version v > 0 starts no earlier than the end of the U that wrote v (the flush barrier of
  synchronous schedules; a worker's own update point otherwise);
* each stage's U events write consecutive master versions 1, 2, 3, …, each from the version before; a U
  applies the gradients pending on its executor — on every executor of its stage under
  ``shared_updates`` — where a gradient is produced by a B, or by the W of a split backward;
* no executor runs two actions at once, nor do two executors that share a device
  (:attr:`TraceSemantics.devices`, Hanayo's waves) (checked by time, so on the virtual clock exactly);
* each applied gradient's staleness τ = (master version at its U) − (version its F read) is at most
  ``bounds[stage]`` (:func:`ferret_core.staleness.staleness_bound` of the plan, or the schedule's own).

On failure :class:`TraceError` carries the violations and the table around the first one, its step
marked ``>>`` and its cell ``*``.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ferret_core.errors import FerretError
from ferret_core.plan import Plan
from ferret_core.schedule.actions import Kind, TraceEvent
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
class TraceSemantics:
    """How a schedule's updates and executors relate, for the validator.

    ``shared_updates``: a U of stage j applies the pending gradients of every executor of stage j and
    refreshes every worker's replica (a synchronous flush: DAPPLE, ZB, Hanayo); otherwise a U is its
    worker's own (Ferret, PipeDream, PipeDream-2BW). ``devices``: the device of each executor where
    several executors share one compute device (Hanayo's waves); ``None``: one device per executor.
    ``bounds``: the staleness bound per stage, replacing the plan's (synchronous schedules: 0).
    """

    shared_updates: bool = False
    devices: Mapping[tuple[int, int], Hashable] | None = None
    bounds: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Violation:
    index: int  # position of the offending event in the trace
    message: str


def plan_bounds(plan: Plan) -> tuple[int, ...]:
    return tuple(staleness_bound(plan, j) for j in range(plan.num_stages))


def check_trace(
    trace: Sequence[TraceEvent],
    num_stages: int,
    bounds: Sequence[int] | None = None,
    semantics: TraceSemantics | None = None,
) -> list[Violation]:
    """Every violation of the invariants in the module docstring (empty when the trace is valid)."""
    sem = semantics or TraceSemantics()
    out: list[Violation] = []
    split = {(e.item, e.stage) for e in trace if e.kind is Kind.W}
    fwd: dict[tuple[int, int], TraceEvent] = {}
    bwd: dict[tuple[int, int], TraceEvent] = {}
    rec: dict[tuple[int, int], TraceEvent] = {}
    replica: dict[tuple[int, int], int] = defaultdict(int)
    master: dict[int, int] = defaultdict(int)
    written_at: dict[tuple[int, int], float] = {}
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
            holds = master[e.stage] if sem.shared_updates else replica[e.executor]
            if e.version_read != holds:
                whose = "the stage's latest" if sem.shared_updates else "the worker's replica"
                out.append(
                    Violation(
                        i,
                        f"F{e.item} on {_name(e.executor)} read version {e.version_read}, but {whose} "
                        f"is at version {holds}",
                    )
                )
            written = written_at.get((e.stage, e.version_read))
            if written is not None and e.start < written - _EPS:
                out.append(
                    Violation(i, f"F{e.item} at stage {e.stage} started at {e.start:g}, before the U that wrote "
                              f"version {e.version_read} ended at {written:g}")
                )
        elif e.kind in (Kind.R, Kind.B, Kind.W):
            out.extend(_check_backward(i, e, fwd, rec, bwd, split, num_stages))
            if e.kind is Kind.R:
                rec[key] = e
                continue
            if e.kind is Kind.B:
                bwd[key] = e
            if e.kind is Kind.W or key not in split:
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
            written_at[(e.stage, master[e.stage])] = e.end
            replica[e.executor] = master[e.stage]
            if sem.shared_updates:
                applied = [b for x in [k for k in pending if k[1] == e.stage] for b in pending.pop(x)]
            else:
                applied = pending.pop(e.executor, [])
            limits = sem.bounds if sem.bounds is not None else bounds
            for b in applied:
                tau = e.version_read - b.version_read
                if limits is not None and tau > limits[e.stage]:
                    out.append(
                        Violation(
                            i,
                            f"staleness {tau} of {b.kind}{b.item}'s gradient at stage {e.stage} exceeds the "
                            f"bound {limits[e.stage]} (read version {b.version_read}, applied at {e.version_read})",
                        )
                    )
    out.extend(_overlaps(trace, sem.devices))
    out.sort(key=lambda v: v.index)
    return out


def _check_backward(
    i: int,
    e: TraceEvent,
    fwd: Mapping[tuple[int, int], TraceEvent],
    rec: Mapping[tuple[int, int], TraceEvent],
    bwd: Mapping[tuple[int, int], TraceEvent],
    split: set[tuple[int, int]],
    num_stages: int,
) -> list[Violation]:
    """Order and version checks of one R, B or W event."""
    out = []
    key = (e.item, e.stage)
    f = fwd.get(key)
    if f is None or e.start < f.end - _EPS:
        out.append(Violation(i, f"{e.kind}{e.item} at stage {e.stage} before its F"))
    elif e.version_read != f.version_read:
        out.append(
            Violation(i, f"{e.kind}{e.item} at stage {e.stage} read version {e.version_read}, "
                      f"its F read {f.version_read} (stash broken)")
        )
    if e.kind is Kind.R:
        return out
    own_b = bwd.get(key)
    if e.kind is Kind.W and own_b is not None:
        if e.start < own_b.end - _EPS:
            out.append(Violation(i, f"W{e.item} at stage {e.stage} before its B ended"))
        return out
    r = rec.get(key)
    if r is not None and e.start < r.end - _EPS:
        out.append(Violation(i, f"{e.kind}{e.item} at stage {e.stage} before its R ended"))
    if e.kind is Kind.B and key in bwd:
        out.append(Violation(i, f"second B of item {e.item} at stage {e.stage}"))
    if e.stage < num_stages - 1:
        above = bwd.get((e.item, e.stage + 1))
        if above is None or e.start < above.end - _EPS:
            out.append(Violation(i, f"{e.kind}{e.item} at stage {e.stage} before its B at stage {e.stage + 1}"))
    return out


def _overlaps(
    trace: Sequence[TraceEvent], devices: Mapping[tuple[int, int], Hashable] | None = None
) -> list[Violation]:
    out = []
    by_unit: dict[Hashable, list[tuple[int, TraceEvent]]] = defaultdict(list)
    for i, e in enumerate(trace):
        if e.kind is not Kind.U:
            by_unit[e.executor if devices is None else devices.get(e.executor, e.executor)].append((i, e))
    for unit, events in by_unit.items():
        events.sort(key=lambda pair: (pair[1].start, pair[0]))
        for (_, prev), (i, e) in itertools.pairwise(events):
            if e.start < prev.end - _EPS:
                where = _name(e.executor) if devices is None else f"device {unit} ({_name(e.executor)})"
                out.append(
                    Violation(i, f"{where} runs {e} from {e.start:g} while {prev} runs until {prev.end:g}")
                )
    return out


def validate_trace(
    trace: Sequence[TraceEvent],
    plan: Plan,
    *,
    check_staleness: bool = True,
    semantics: TraceSemantics | None = None,
) -> None:
    """Raise :class:`TraceError` (with the marked table) unless ``trace`` satisfies every invariant
    (staleness against the plan's bound, or the schedule's own in ``semantics``, when ``check_staleness``)."""
    sem = semantics or TraceSemantics()
    if not check_staleness:
        sem = TraceSemantics(sem.shared_updates, sem.devices, None)
    bounds = plan_bounds(plan) if check_staleness else None
    violations = check_trace(trace, plan.num_stages, bounds, sem)
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


def staleness_by_stage(
    trace: Iterable[TraceEvent], num_stages: int, semantics: TraceSemantics | None = None
) -> list[list[int]]:
    """τ of every applied gradient, per stage, in application order."""
    events = list(trace)
    shared = semantics is not None and semantics.shared_updates
    split = {(e.item, e.stage) for e in events if e.kind is Kind.W}
    out: list[list[int]] = [[] for _ in range(num_stages)]
    pending: dict[tuple[int, int], list[int]] = defaultdict(list)
    for e in events:
        if e.kind is Kind.W or (e.kind is Kind.B and (e.item, e.stage) not in split):
            pending[(e.stage, e.worker) if not shared else (e.stage, 0)].append(e.version_read)
        elif e.kind is Kind.U:
            key = (e.stage, e.worker) if not shared else (e.stage, 0)
            out[e.stage].extend(e.version_read - v for v in pending.pop(key, []))
    return out


def mean_staleness(
    trace: Iterable[TraceEvent], num_stages: int, semantics: TraceSemantics | None = None
) -> tuple[float, ...]:
    return tuple(sum(s) / len(s) if s else 0.0 for s in staleness_by_stage(trace, num_stages, semantics))


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
