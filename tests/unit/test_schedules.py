"""The pipeline schedules (DAPPLE, ZB, Hanayo, PipeDream, PipeDream-2BW): their invariants over random cases,
equivalence with plain references, and the validator's new checks (flush barriers, B/W split, devices)."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections import defaultdict
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from ferret_core.engine import (
    EngineSettings,
    Kind,
    SimulationResult,
    StreamEngine,
    TraceError,
    TraceEvent,
    make_policy,
)
from ferret_core.engine.method_registry import MethodOptions
from ferret_core.engine.schedules.split_backward import backward_root, input_gradient, weight_gradients
from ferret_core.engine.stage_exec import backward, build_stages, forward_with_grad
from ferret_core.engine.steps import Batch, PlainSteps, TrainingStep
from ferret_core.engine.trace import TraceSemantics, check_trace, validate_trace
from ferret_core.errors import ConfigError
from ferret_core.plan import Partition, Plan
from tests.unit.test_engine_support import make_plan, stream, tiny_units, uniform_times

SYNCHRONOUS = ("dapple", "zb", "hanayo-1w", "hanayo-2w", "hanayo-3w")
ASYNCHRONOUS = ("pipedream", "pipedream-2bw")
LR = 0.05


def run(method: str, plan: Plan, n: int, *, arrival: float = 1.0, tf: float = 1.0, tb: float = 2.0,
        flush_every: int | None = None, wall: bool = False):  # type: ignore[no-untyped-def]
    policy = make_policy(method, plan, options=MethodOptions(flush_every=flush_every))
    setup = policy.setup("tiny", plan.partition.num_units, arrival)
    units = tiny_units(num_units=plan.partition.num_units)
    engine = StreamEngine(units, setup, EngineSettings(lr=LR, measure_memory=False))
    items = stream(n)
    if wall:
        result = engine.run_wall(items, 0.0)
    else:
        result = engine.run_virtual(items, uniform_times(plan.num_stages, tf, tb), arrival)
    assert result.trace is not None
    return engine, result, units, items


# ------------------------------------------------------------------------------------------ B / W split
def test_split_backward_equals_the_fused_backward() -> None:
    programs, versions = build_stages(tiny_units(), Partition((0, 1, 3)))
    x = torch.randn(1, 6)
    target = torch.tensor([2])
    for stage, kwargs in ((1, {"target": target}), (0, {"grad_output": torch.randn(1, 8)})):
        runner, version = programs[stage].runner(), versions[stage]
        x_in = x if stage == 0 else torch.randn(1, 8)
        fused, grad_in = backward(forward_with_grad(runner, version, x_in, input_grad=True), **kwargs)  # type: ignore[arg-type]
        graph = forward_with_grad(runner, version, x_in, input_grad=True)
        root = backward_root(graph, target=kwargs.get("target"))
        split_in = input_gradient(graph, root, kwargs.get("grad_output"))
        split = weight_gradients(graph, root, kwargs.get("grad_output"))
        torch.testing.assert_close(split_in, grad_in)
        for a, b in zip(split, fused, strict=True):
            torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------- synchronous = plain SGD
def _groups(trace: list[TraceEvent], stages: int) -> tuple[dict[int, list[int]], list[int]]:
    """Items by the version their forwards read (= their flush group), and each stage's final version."""
    groups: dict[int, set[int]] = defaultdict(set)
    for e in trace:
        if e.kind is Kind.F:
            groups[e.version_read].add(e.item)
    final = [0] * stages
    for e in trace:
        if e.kind is Kind.U and e.version_written is not None:
            final[e.stage] = max(final[e.stage], e.version_written)
    return {g: sorted(items) for g, items in groups.items()}, final


@pytest.mark.parametrize("method", SYNCHRONOUS)
def test_a_synchronous_schedule_is_plain_sgd_on_the_summed_gradients_of_each_flush_group(method: str) -> None:
    plan = make_plan(3, 2)
    engine, result, units, items = run(method, plan, 40, arrival=0.5, flush_every=2)
    groups, final = _groups(list(result.trace or ()), 3)
    assert max(final) >= 2, "the stream should flush a few groups"
    reference = nn.Sequential(*copy.deepcopy(list(units)))
    stage_params = [list(reference[u].parameters()) for u in range(3)]  # one unit per stage
    for g in sorted(groups):
        reference.zero_grad()
        for i in groups[g]:
            loss = nn.functional.cross_entropy(reference(items[i].x.unsqueeze(0)), torch.tensor([items[i].y]))
            loss.backward()
        with torch.no_grad():
            for j in range(3):
                if g < final[j]:  # stage j flushed group g
                    for p in stage_params[j]:
                        p -= LR * p.grad  # type: ignore[operator]
    for j, master in enumerate(engine.pipeline.master_state()):
        expected = {**dict(reference[j].named_parameters(prefix="0")), **dict(reference[j].named_buffers(prefix="0"))}
        assert master.keys() == expected.keys()
        for name, value in master.items():
            torch.testing.assert_close(value, expected[name])


# ------------------------------------------------------------------------------ invariants, random
def _gradient_counts(trace: list[TraceEvent]) -> dict[int, list[int]]:
    """Per stage: the number of gradients each U applied (any executor: a flush applies them all)."""
    split = {(e.item, e.stage) for e in trace if e.kind is Kind.W}
    waiting: dict[int, int] = defaultdict(int)
    out: dict[int, list[int]] = defaultdict(list)
    for e in trace:
        if e.kind is Kind.W or (e.kind is Kind.B and (e.item, e.stage) not in split):
            waiting[e.stage] += 1
        elif e.kind is Kind.U:
            out[e.stage].append(waiting.pop(e.stage, 0))
    return out


@settings(max_examples=int(os.environ.get("FERRET_HYPOTHESIS_EXAMPLES", "40")), deadline=None)
@given(
    method=st.sampled_from(SYNCHRONOUS + ASYNCHRONOUS),
    stages=st.integers(1, 4),
    slots=st.integers(1, 3),
    m=st.integers(1, 4),
    tf=st.sampled_from([0.5, 1.0, 2.0]),
    tb=st.sampled_from([1.0, 2.0, 3.0]),
    arrival=st.sampled_from([0.25, 0.5, 1.0, 2.0]),
    recompute=st.booleans(),
)
def test_every_schedule_keeps_its_invariants(
    method: str, stages: int, slots: int, m: int, tf: float, tb: float, arrival: float, recompute: bool
) -> None:
    if method == "pipedream-2bw":
        m = max(m, stages - 1)
    plan = make_plan(stages, slots, num_units=4, recompute=recompute)
    engine, r, _, _ = run(method, plan, 18, arrival=arrival, tf=tf, tb=tb, flush_every=m)
    trace = list(r.trace or ())
    semantics = engine.pipeline.trace_semantics
    validate_trace(trace, engine.setup.plan, check_staleness=True, semantics=semantics)  # plan's or schedule's bound
    assert r.trained_any_stage + sum(r.skipped.values()) == r.items == 18
    assert r.trained == r.trained_any_stage  # no schedule omits a stage (T3 is Ferret's)
    assert set(r.skipped) >= {"busy"} and sum(v for k, v in r.skipped.items() if k != "busy") == 0
    if method in SYNCHRONOUS:
        assert r.max_staleness == (0,) * stages
        rules = engine.setup.rules
        group = rules.num_slots * m  # type: ignore[attr-defined]
        for stage, counts in _gradient_counts(trace).items():
            assert all(c == group for c in counts), (stage, counts, group)
        assert max(r.updates_per_stage) - min(r.updates_per_stage) <= 1
    if method == "zb":
        assert {e.kind for e in trace} >= {Kind.F, Kind.W}
    else:
        assert Kind.W not in {e.kind for e in trace}
    if method == "pipedream-2bw":
        assert _most_versions_in_use(trace) <= 2


def _most_versions_in_use(trace: list[TraceEvent]) -> int:
    """Most distinct versions of one stage a worker uses at once: its replica's and its in-flight items'."""
    events = sorted(trace, key=lambda e: (e.start, e.kind is not Kind.F))
    reading: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)  # executor → item → version
    replica: dict[tuple[int, int], int] = defaultdict(int)
    most = 1
    for e in events:
        if e.kind is Kind.F:
            reading[e.executor][e.item] = e.version_read
        elif e.kind is Kind.B:
            reading[e.executor].pop(e.item, None)
        elif e.kind is Kind.U and e.version_written is not None:
            replica[e.executor] = e.version_written
        versions = set(reading[e.executor].values()) | {replica[e.executor]}
        most = max(most, len(versions))
    return most


def test_pipedream_keeps_one_version_per_item_in_flight_and_pipedreams_staleness() -> None:
    plan = make_plan(4, 1)
    _, r, _, _ = run("pipedream", plan, 40, arrival=3.0)
    assert r.max_staleness == (3, 2, 1, 0) and r.updates_per_stage == (40,) * 4
    assert _most_versions_in_use(list(r.trace or ())) == 4  # stage 0: its replica + 3 older items' stashes


def test_pipedream_2bw_needs_m_of_at_least_p_minus_one() -> None:
    with pytest.raises(ConfigError, match="m >= P - 1"):
        make_policy("pipedream-2bw", make_plan(4, 1), options=MethodOptions(flush_every=2))
    _, r, _, _ = run("pipedream-2bw", make_plan(4, 1), 40, arrival=3.0, flush_every=3)
    assert _most_versions_in_use(list(r.trace or ())) == 2 and r.updates_per_stage == (13,) * 4


def test_hanayo_rows_alternate_direction_on_shared_devices() -> None:
    setup = make_policy("hanayo-2w", make_plan(3, 2)).setup("tiny", 3, 1.0)
    devices = setup.rules.devices  # type: ignore[attr-defined]
    assert setup.plan.num_workers == 8  # 2 slots × 2W rows; row n = r·2 + slot
    assert [devices[(0, j)] for j in range(3)] == [(0, 0), (0, 1), (0, 2)]  # slot 0's first row: down
    assert [devices[(1, j)] for j in range(3)] == [(1, 0), (1, 1), (1, 2)]  # slot 1's first row
    assert [devices[(2, j)] for j in range(3)] == [(0, 2), (0, 1), (0, 0)]  # slot 0's second row: up
    assert [devices[(4, j)] for j in range(3)] == [(0, 0), (0, 1), (0, 2)]  # its third: down again
    assert {setup.rules.slot(n) for n in (0, 2, 4, 6)} == {0}  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="1, 2 or 3 waves"):
        from ferret_core.engine.schedules import Hanayo

        Hanayo(make_plan(3, 1), 4)


@pytest.mark.parametrize("method", SYNCHRONOUS + ASYNCHRONOUS)
def test_schedules_run_on_the_wall_clock(method: str) -> None:
    engine, r, _, _ = run(method, make_plan(3, 2), 12, wall=True)
    assert r.trained_any_stage + sum(r.skipped.values()) == 12 and r.trained > 0
    assert engine.pipeline.scheduler.idle()


# ---------------------------------------------------------------------------- validator's new checks
def _sync_trace(method: str = "dapple") -> tuple[list[TraceEvent], TraceSemantics]:
    engine, r, _, _ = run(method, make_plan(3, 1), 60, arrival=0.5)
    return list(r.trace or ()), engine.pipeline.trace_semantics


def test_a_forward_of_the_next_group_before_the_flush_fails() -> None:
    trace, semantics = _sync_trace()
    assert check_trace(trace, 3, semantics=semantics) == []
    u = next(e for e in trace if e.kind is Kind.U and e.stage == 1)
    i = next(i for i, e in enumerate(trace) if e.kind is Kind.F and e.stage == 1 and e.version_read == 1)
    broken = list(trace)
    broken[i] = dataclasses.replace(trace[i], start=u.end - 0.5, end=u.end - 0.25)
    messages = [v.message for v in check_trace(broken, 3, semantics=semantics)]
    assert any("before the U that wrote version 1" in m for m in messages), messages


def test_a_stale_gradient_in_a_flush_fails_against_the_bound_zero() -> None:
    trace, semantics = _sync_trace()
    i = next(i for i, e in enumerate(trace) if e.kind is Kind.B and e.stage == 2 and e.version_read == 1)
    f = next(k for k, e in enumerate(trace) if e.kind is Kind.F and (e.item, e.stage) == (trace[i].item, 2))
    broken = list(trace)
    broken[i] = dataclasses.replace(trace[i], version_read=0)
    broken[f] = dataclasses.replace(trace[f], version_read=0)
    messages = [v.message for v in check_trace(broken, 3, semantics=semantics)]
    assert any("exceeds the bound 0" in m for m in messages)
    with pytest.raises(TraceError):
        validate_trace(broken, make_plan(3, 1), semantics=semantics)


def test_a_weight_gradient_before_its_input_gradient_fails() -> None:
    trace, semantics = _sync_trace("zb")
    i = next(i for i, e in enumerate(trace) if e.kind is Kind.W and e.stage == 1)
    b = next(e for e in trace if e.kind is Kind.B and (e.item, e.stage) == (trace[i].item, 1))
    broken = list(trace)
    broken[i] = dataclasses.replace(trace[i], start=b.end - 0.5)
    messages = [v.message for v in check_trace(broken, 3, semantics=semantics)]
    assert any(f"W{trace[i].item} at stage 1 before its B ended" in m for m in messages)


def test_two_actions_on_one_device_at_once_fail() -> None:
    engine, r, _, _ = run("hanayo-1w", make_plan(3, 1), 12)
    trace, semantics = list(r.trace or ()), engine.pipeline.trace_semantics
    assert semantics.devices is not None and check_trace(trace, 3, semantics=semantics) == []
    # w1s0 shares device 2 with w0s2: move one of w1s0's actions onto one of w0s2's
    a = next(i for i, e in enumerate(trace) if e.executor == (1, 0) and e.kind is Kind.F)
    b = next(e for e in trace if e.executor == (0, 2) and e.kind is not Kind.U)
    broken = list(trace)
    broken[a] = dataclasses.replace(trace[a], start=b.start, end=b.start + 0.5)
    messages = [v.message for v in check_trace(broken, 3, semantics=semantics)]
    assert any("device (0, 2)" in m for m in messages), messages
    assert not any("device" in m for m in (v.message for v in check_trace(broken, 3)))


def test_flush_groups_hold_m_items_per_pipeline() -> None:
    for method, rows in (("dapple", 2), ("hanayo-1w", 4)):
        engine, r, _, _ = run(method, make_plan(2, 2), 30, arrival=0.5, flush_every=3)
        assert engine.setup.plan.num_workers == rows
        counts = _gradient_counts(list(r.trace or ()))
        assert counts[0] and all(c == 6 for c in counts[0])  # 2 pipelines × m = 3
        assert math.isclose(r.trained / max(1, len(counts[0])), 6, rel_tol=0.5)


# ------------------------------------------------------------------------- with an OCL algorithm
class _ScaledLoss(PlainSteps):
    """Vanilla with its loss scaled by ``scale`` (an algorithm whose loss is not plain cross-entropy),
    recording the step count each update's ``regularise`` is given, per stage."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.counts: dict[int, list[int]] = defaultdict(list)

    def step(self, new: Batch) -> TrainingStep:
        plain = TrainingStep.plain(new)
        return dataclasses.replace(plain, loss=lambda output: self.scale * plain.loss(output))

    def regularise(self, stage: int, params: Sequence[Tensor], grads: list[Tensor], count: int) -> list[Tensor]:
        self.counts[stage].append(count)
        return grads


def _run_with(method: str, algorithm: _ScaledLoss, lr: float) -> tuple[StreamEngine, SimulationResult]:
    plan = make_plan(3, 2)
    setup = make_policy(method, plan, options=MethodOptions(flush_every=2)).setup("tiny", 3, 1.0)
    engine = StreamEngine(tiny_units(num_units=3), setup, EngineSettings(lr=lr, measure_memory=False),
                          algorithm=algorithm)
    return engine, engine.run_virtual(stream(24), uniform_times(3), 1.0)


@pytest.mark.parametrize("method", SYNCHRONOUS + ASYNCHRONOUS)
def test_schedules_back_propagate_the_algorithms_loss_and_count_its_steps(method: str) -> None:
    """An algorithm's loss reaches the last stage (also through ZB's split B/W): loss × 2 at lr equals
    loss × 1 at 2·lr under SGD; and each update tells ``regularise`` how many steps' gradients it sums
    (a flush sums m per row), so the updates' counts add up to the stages' backward passes (less those
    still pending at the stream's end)."""
    doubled, _ = _run_with(method, _ScaledLoss(2.0), LR)
    plain_algorithm = _ScaledLoss(1.0)
    plain, _ = _run_with(method, plain_algorithm, 2 * LR)
    for a, b in zip(doubled.pipeline.store.masters(), plain.pipeline.store.masters(), strict=True):
        for x, y in zip(a.params, b.params, strict=True):
            torch.testing.assert_close(x, y)
    p = plain.pipeline
    for j in range(3):
        backwards = sum(row[j] for row in p.counters.backwards)
        left = p.updater.pending_steps(j)  # kept and not applied: a buffer, or a group left unflushed
        assert sum(plain_algorithm.counts[j]) == backwards - left and left < backwards
