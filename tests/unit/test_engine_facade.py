"""The engine facade as adapters use it: the wall clock's :class:`Arrival` names the worker, ``stats()``
reports typed counters, ``score_online`` off leaves scoring to the caller, and the compensators' state
round-trips exactly and carries across a re-plan (:mod:`ferret_core.engine.carry`)."""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine import EngineSettings, EngineStats, FerretPolicy, Kind, Oracle, StreamEngine
from ferret_core.engine.carry import carry_compensator_states
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from tests.unit.test_engine_support import make_plan, run_plan, stream, tiny_units, uniform_times

# η_λ large enough that λ visibly moves in a few dozen items (the paper's 2e-6 leaves it at λ⁰).
TUNED = CompensatorSettings(eta_lambda=0.5)


def engine_for(plan, compensator: str = "iter-fisher", seed: int = 0, **settings: object) -> StreamEngine:  # type: ignore[no-untyped-def]
    units = tiny_units(seed=seed, num_units=plan.partition.num_units)
    engine_settings = EngineSettings(compensator=compensator, compensator_settings=TUNED, **settings)  # type: ignore[arg-type]
    return StreamEngine(units, FerretPolicy(plan).setup("tiny", len(units), 1.0), engine_settings)


def test_arrival_carries_the_worker_the_pipeline_dispatched_to() -> None:
    plan = make_plan(2, 3, live=[True, False, True])
    engine = engine_for(plan, compensator="none")
    items = stream(12)
    with engine.wall_clock() as clock:
        arrivals = []
        for i, item in enumerate(items):
            arrivals.append(clock.submit(item.x, item.y, index=i).result(10))
            clock.drain(10)  # one at a time: no worker is ever busy
        unlabelled = clock.submit(items[0].x, None, index=99).result(10)
    for a in arrivals:
        if a.index % 3 == 1:
            assert a.skipped is not None and a.skipped.value == "worker_removed" and a.worker is None
        else:
            assert a.skipped is None and a.worker == a.index % 3
    assert unlabelled.worker is None and unlabelled.skipped is not None


def test_stats_match_the_result_and_are_typed() -> None:
    plan = make_plan(3, 2, accumulation=[[1, 2, 1], [2, 1, 1]])
    engine, result = run_plan(plan, stream(30))
    stats = engine.stats()
    assert isinstance(stats, EngineStats)
    assert (stats.items, stats.trained) == (result.items, result.trained)
    assert stats.trained_any_stage == result.trained_any_stage
    assert stats.skipped == result.skipped and stats.updates_per_stage == result.updates_per_stage
    assert stats.updates == sum(result.updates_per_stage) and stats.in_flight == 0
    assert stats.peak_bytes == result.peak_bytes and stats.mean_staleness == result.mean_staleness
    assert stats.max_staleness == result.max_staleness
    with pytest.raises(AttributeError):
        stats.items = 0  # type: ignore[misc]


def test_score_online_off_leaves_scoring_to_the_caller() -> None:
    plan = make_plan(1, 1)
    _, scored = run_plan(plan, stream(20))
    _, unscored = run_plan(plan, stream(20), score_online=False)
    assert scored.oacc > 0 and unscored.oacc == 0.0
    assert unscored.items == scored.items == 20 and unscored.trained == scored.trained


def _tensors_equal(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert_close(a, b, rtol=0.0, atol=0.0)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            _tensors_equal(a[key], b[key])
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _tensors_equal(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b)
    else:
        assert a == b


@pytest.mark.parametrize("compensator", ["iter-fisher", "iter-fisher-cf", "gap-aware", "fisher"])
def test_compensator_state_round_trips_exactly(compensator: str) -> None:
    plan = make_plan(3, 2)
    engine = engine_for(plan, compensator)
    engine.run_virtual(stream(40), uniform_times(3), 1.0)
    saved = engine.compensator_state()
    if compensator.startswith("iter-fisher"):
        assert saved[0]["lambda"] != 0.2  # λ moved: the test would notice a reset
        assert len(saved[0]["ring"]["deltas"]) > 0 and saved[0]["v_r"] is not None
    other = engine_for(plan, compensator, seed=1)
    other.load_compensator_state(saved)
    restored = other.compensator_state()
    _tensors_equal(saved, restored)  # λ, v_r, v_a, the ring's deltas (oldest first), counters


def test_compensator_state_refuses_another_plans_rings() -> None:
    engine = engine_for(make_plan(3, 2))
    engine.run_virtual(stream(20), uniform_times(3), 1.0)
    other = engine_for(make_plan(3, 1))  # one worker: smaller staleness bounds, smaller rings
    with pytest.raises(ConfigError, match="capacity"):
        other.load_compensator_state(engine.compensator_state())


def test_a_replan_with_the_same_partition_carries_lambda_and_moments_and_empties_the_ring() -> None:
    old = engine_for(make_plan(3, 2))
    old.run_virtual(stream(40), uniform_times(3), 1.0)
    states = old.compensator_state()
    new = engine_for(make_plan(3, 1))  # the same stages, one worker fewer
    new.carry_compensator_state(states, same_partition=True)
    carried = new.compensator_state()
    for j, (before, after) in enumerate(zip(states, carried, strict=True)):
        if j == 2:  # one worker: the last stage is never stale, so it keeps no v_r, v_a and λ stays λ⁰
            assert after["v_r"] is None and after["v_a"] is None and after["lambda"] == 0.2
            continue
        assert after["lambda"] == before["lambda"]
        _tensors_equal(before["v_r"], after["v_r"])
        _tensors_equal(before["v_a"], after["v_a"])
        assert [after[k] for k in ("calls", "compensated", "truncated")] == [
            before[k] for k in ("calls", "compensated", "truncated")
        ]
        assert after["ring"]["deltas"] == [] and after["ring"]["pushed"] == 0


def test_a_replan_that_moves_the_stages_resplits_per_parameter_state_and_weights_lambda() -> None:
    # two workers: every stage can be stale, so every stage keeps v_r, v_a (one worker's last stage keeps none)
    old = engine_for(make_plan(2, 2, num_units=4))  # stages [0, 2), [2, 4)
    old.run_virtual(stream(40), uniform_times(2), 1.0)
    states = old.compensator_state()
    new = engine_for(make_plan(4, 2, num_units=4))  # one unit per stage
    new.carry_compensator_state(states, same_partition=False)
    carried = new.compensator_state()
    for key in ("v_r", "v_a"):
        flat_old = [t for s in states for t in s[key]]
        flat_new = [t for s in carried for t in s[key]]
        _tensors_equal(flat_old, flat_new)  # every parameter keeps its values
    # each new stage's parameters all come from one old stage: its λ exactly
    assert [s["lambda"] for s in carried] == [states[0]["lambda"]] * 2 + [states[1]["lambda"]] * 2
    assert all(s["calls"] == 0 and s["ring"]["deltas"] == [] for s in carried)


def test_lambda_of_a_merged_stage_is_the_element_weighted_mean() -> None:
    params = [[torch.zeros(3)], [torch.zeros(1)]]
    old = [make_compensator("iter-fisher", p, TUNED, 2).state_dict() for p in params]
    old[0]["lambda"], old[1]["lambda"] = 1.0, 5.0
    fresh = [make_compensator("iter-fisher", [torch.zeros(3), torch.zeros(1)], TUNED, 4).state_dict()]
    [merged] = carry_compensator_states(old, fresh, same_partition=False)
    assert merged["lambda"] == pytest.approx((3 * 1.0 + 1 * 5.0) / 4)


def test_gap_aware_keeps_its_step_average_and_the_smallest_update_count() -> None:
    params = [[torch.zeros(2)], [torch.zeros(2)]]
    old = [make_compensator("gap-aware", p, TUNED, 1) for p in params]
    for k, compensator in enumerate(old):
        for _ in range(k + 2):
            compensator.observe_update([torch.ones(2)])
    fresh = [make_compensator("gap-aware", [torch.zeros(2), torch.zeros(2)], TUNED, 1).state_dict()]
    [merged] = carry_compensator_states([c.state_dict() for c in old], fresh, same_partition=False)
    assert merged["updates"] == 2
    _tensors_equal(merged["avg_step"], [old[0].state_dict()["avg_step"][0], old[1].state_dict()["avg_step"][0]])


def test_carrying_between_different_compensators_is_refused() -> None:
    old = [make_compensator("gap-aware", [torch.zeros(2)], TUNED, 0).state_dict()]
    fresh = [make_compensator("iter-fisher", [torch.zeros(2)], TUNED, 1).state_dict()]
    with pytest.raises(ConfigError, match="different compensators"):
        carry_compensator_states(old, fresh, same_partition=True)


# -- the plan in force, the master's weights, a failed action's item, the per-action hook ----------------


def test_plan_and_planned_are_the_setups() -> None:
    plan = make_plan(2, 2)
    engine = engine_for(plan)
    assert engine.plan == plan and engine.planned == plan
    assert StreamEngine(tiny_units(), Oracle().setup("tiny", 3, 1.0)).planned is None


@pytest.mark.parametrize(
    "change",
    [
        {"arrival_interval": 0.25},
        {"adaptation_rate": 0.5},
        {"planned_bytes": 1},
    ],
)
def test_a_plan_that_only_moves_the_rate_is_retargeted_while_the_pipeline_runs(change: dict[str, object]) -> None:
    plan = make_plan(2, 2)
    engine = engine_for(plan, compensator="none")
    pipeline = engine.pipeline
    items = stream(12)
    faster = dataclasses.replace(plan, **change)  # type: ignore[arg-type]
    with engine.wall_clock() as clock:
        for i, item in enumerate(items[:6]):
            clock.submit(item.x, item.y, index=i).result(10)
        assert engine.can_retarget(faster)
        engine.retarget(faster)  # undrained: the executors run on
        assert engine.plan == faster and engine.planned == faster
        for i, item in enumerate(items[6:], start=6):
            clock.submit(item.x, item.y, index=i).result(10)
        clock.drain(30)
    assert engine.pipeline is pipeline  # not rebuilt
    stats = engine.stats()
    assert stats.items == 12 and stats.in_flight == 0 and stats.updates > 0


@pytest.mark.parametrize(
    "other",
    [
        make_plan(2, 1),  # a worker fewer
        make_plan(3, 2, num_units=2 * 2 - 1),  # other stages
        make_plan(2, 2, recompute=True),
        make_plan(2, 2, accumulation=2),
        dataclasses.replace(make_plan(2, 2), decay=0.2),
        dataclasses.replace(make_plan(2, 2), stage_forward_time=3.0),
        dataclasses.replace(make_plan(2, 2), stage_backward_time=3.0),
        dataclasses.replace(make_plan(2, 2), dtype="bfloat16"),
        dataclasses.replace(make_plan(2, 2), memory_model="none"),
        dataclasses.replace(make_plan(2, 2), model="other"),
    ],
)
def test_a_plan_that_changes_the_pipeline_is_refused_and_the_plan_stays(other: Plan) -> None:
    plan = make_plan(2, 2)
    engine = engine_for(plan)
    assert not engine.can_retarget(other)
    with pytest.raises(ConfigError, match="retarget"):
        engine.retarget(other)
    assert engine.plan == plan and engine.planned == plan


def _named_tensors(unit: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(unit.named_parameters()), **dict(unit.named_buffers())}


def test_unit_state_keys_every_units_tensors_and_copies_the_master() -> None:
    plan = make_plan(2, 1, num_units=3)  # stages [0, 2), [2, 3): unit 1 is stage 0's second unit
    units = tiny_units(num_units=3)
    units[1].register_buffer("scale", torch.full((2,), 3.0))  # a buffer, keyed as parameters are
    engine = StreamEngine(units, FerretPolicy(plan).setup("tiny", 3, 1.0), EngineSettings())
    before = engine.unit_state()
    assert before.keys() == {(u, name) for u, unit in enumerate(units) for name in _named_tensors(unit)}
    for (u, name), value in before.items():
        assert_close(value, _named_tensors(units[u])[name], rtol=0.0, atol=0.0)  # built from the units
    engine.run_virtual(stream(20), uniform_times(2), 1.0)
    after = engine.unit_state()
    assert not torch.equal(after[(0, "0.weight")], before[(0, "0.weight")])  # trained
    # stage by stage, in the stage module's order: the masters' tensors
    flat = [t for version in engine.masters() for t in version.tensors()]
    assert len(flat) == len(after)
    for value, master in zip(after.values(), flat, strict=True):
        assert_close(value, master, rtol=0.0, atol=0.0)
        assert value.data_ptr() != master.data_ptr()  # a copy: writing it leaves the master alone


def test_masters_are_one_version_per_stage_and_move_with_updates() -> None:
    engine = engine_for(make_plan(3, 2), compensator="none")
    initial = engine.masters()
    assert [v.stage for v in initial] == [0, 1, 2] and all(v.version == 0 for v in initial)
    result = engine.run_virtual(stream(20), uniform_times(3), 1.0)
    masters = engine.masters()
    assert [v.version for v in masters] == list(result.updates_per_stage)


def test_evaluate_is_the_results_test_accuracy() -> None:
    engine = engine_for(make_plan(2, 1), compensator="none")
    items = stream(40)
    x = torch.stack([item.x for item in items])
    y = torch.tensor([item.y for item in items])
    result = engine.run_virtual(items[:30], uniform_times(2), 1.0, test=(x, y))
    assert result.tacc is not None and engine.evaluate(x, y) == result.tacc


def _hooked(hook: Callable[[], None]) -> StreamEngine:
    return StreamEngine(
        tiny_units(num_units=1), FerretPolicy(make_plan(1, 1)).setup("tiny", 1, 1.0), end_of_action=hook
    )


def test_end_of_action_runs_after_every_action_and_a_failure_names_its_item() -> None:
    calls: list[int] = []
    result = _hooked(lambda: calls.append(1)).run_virtual(stream(5), uniform_times(1), 1.0)
    events = result.trace
    assert events is not None and len(calls) == len(events) > 0  # after every F, B and U
    last_forward = max(k for k, event in enumerate(events) if event.kind is Kind.F)
    blamed = events[last_forward].item
    assert blamed not in (0, 4)  # neither the first item nor the last arrival: the failing action's own

    def fail_at_the_last_forward() -> None:
        failed.append(1)
        if len(failed) == last_forward + 1:
            raise RuntimeError("injected")

    failed: list[int] = []
    engine = _hooked(fail_at_the_last_forward)
    assert engine.failed_item is None
    with pytest.raises(RuntimeError, match="injected"):
        engine.run_virtual(stream(5), uniform_times(1), 1.0)
    assert engine.failed_item == blamed


# -- services/ drive the engine through this facade only -------------------------------------------------

SERVICES = Path(__file__).resolve().parents[2] / "services"
ENGINE_INTERNALS = frozenset({"pipeline", "setup"})


def internal_accesses(source: str) -> list[str]:
    """Where ``source`` reads or writes an attribute ``pipeline`` or ``setup`` that it does not call
    (``StreamEngine.pipeline``/``.setup``, ``WallClock.pipeline``; ``policy.setup(...)`` and
    ``redis.pipeline(...)`` are calls), or names one to ``getattr``/``setattr``: ``line: expression``."""
    tree = ast.parse(source)
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}

    def internal(node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr in ENGINE_INTERNALS and id(node) not in called
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in ENGINE_INTERNALS
        )

    hits = [node for node in ast.walk(tree) if isinstance(node, ast.expr) and internal(node)]
    return [f"{node.lineno}: {ast.unparse(node)}" for node in hits]


@pytest.mark.parametrize(
    "violation",
    [
        "self.engine.pipeline.end_of_action = hook",
        "failed = self.engine.pipeline.failed_item",
        "self.engine.setup = dataclasses.replace(self.engine.setup, plan=plan)",
        "stages = self._engine.setup.plan.partition.stages",
        "masters = learner.engine.pipeline.masters()",
        "p = engine.pipeline",
        "return clock.pipeline.plan",
        "item = getattr(self.engine, 'pipeline').failed_item",
    ],
)
def test_the_check_catches_an_access_to_the_engines_internals(violation: str) -> None:
    assert internal_accesses(f"def f(self, engine, learner, clock, hook, plan):\n    {violation}\n")


def test_the_check_lets_calls_named_setup_or_pipeline_through() -> None:
    source = (
        "setup = make_policy(method, plan).setup(model, units, interval)\n"
        "pipe = self._redis.pipeline(transaction=False)\n"
        "plan = self.engine.plan\n"
    )
    assert internal_accesses(source) == []


def test_services_reach_the_engine_only_through_its_facade() -> None:
    files = sorted(SERVICES.rglob("*.py"))
    learner = SERVICES / "trainer" / "engine_learner.py"
    assert learner in files and len(files) > 50  # the check reads the adapter and the whole tree
    assert "self.engine." in learner.read_text(encoding="utf-8")  # the adapter does drive an engine
    found = {
        str(path.relative_to(SERVICES.parent)): hits
        for path in files
        if (hits := internal_accesses(path.read_text(encoding="utf-8")))
    }
    assert found == {}
