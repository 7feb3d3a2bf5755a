"""The live planner plans in the machine's time: the profile scaled by measured ÷ profiled service time
(``docs/planner.md`` reading 11; ours, not in the paper)."""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from ferret_core.errors import ConfigError, ProfileError
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from services.trainer.arrivals import DriftReplanner, SwitchablePlanner, measured_time_scale

ROOT = Path(__file__).resolve().parents[2]
MNISTNET = ModelProfile.load(ROOT / "benchmarks" / "profiles" / "mnistnet.json")  # T = 1.09 ms


def test_a_scaled_profile_multiplies_every_time_and_keeps_the_sizes() -> None:
    scaled = MNISTNET.scaled(4.0)
    assert scaled.sequential_time == pytest.approx(4.0 * MNISTNET.sequential_time, rel=1e-12)
    for a, b in zip(MNISTNET.layers, scaled.layers, strict=True):
        assert (b.t_f, b.t_b) == (pytest.approx(4 * a.t_f), pytest.approx(4 * a.t_b))
        assert (b.params, b.activations, b.saved) == (a.params, a.activations, a.saved)
    assert scaled.scaled(0.5).meta["time_scale"] == 2.0
    assert MNISTNET.scaled(1.0) is MNISTNET
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ProfileError):
            MNISTNET.scaled(bad)
    with pytest.raises(ConfigError):
        PlannerSettings(time_scale=0.0)


def test_the_stream_bound_decision_uses_the_measured_time_per_item() -> None:
    """At 294 items/s (3.4 ms) the profile says one worker keeps up (1.09 ms per item): 1 × 1. Measured at
    4 × the profile (4.4 ms per item) it does not: the plan is no longer stream-bound, R_F decides."""
    interval = 1 / 294
    by_profile = Planner(MNISTNET, PlannerSettings(arrival_interval=interval, max_workers=2))
    assert by_profile.stream_bound
    plan = by_profile.plan(None)
    assert (plan.num_stages, plan.num_workers) == (1, 1)
    measured = Planner(MNISTNET, PlannerSettings(arrival_interval=interval, max_workers=2, time_scale=4.0))
    assert not measured.stream_bound
    assert measured.base_profile is MNISTNET
    scaled_plan = measured.plan(None)
    assert scaled_plan.adaptation_rate > 0
    # R_F's t^f, t^b and the default c are read in the machine's time
    assert measured.profile.sequential_time == pytest.approx(4 * MNISTNET.sequential_time)
    assert measured.decay == pytest.approx(by_profile.decay / 4)
    one = Planner(MNISTNET, PlannerSettings(arrival_interval=interval, max_workers=1, time_scale=4.0)).plan(None)
    assert one.stage_forward_time + one.stage_backward_time <= 4 * MNISTNET.sequential_time * (1 + 1e-9)
    # an explicit c is in the profile's time: the same c over the scale in the machine's
    given = Planner(MNISTNET, PlannerSettings(arrival_interval=interval, decay=600.0, time_scale=4.0))
    assert given.decay == pytest.approx(150.0)


def test_a_slow_enough_stream_stays_one_unsplit_worker_when_measured_slower() -> None:
    planner = Planner(MNISTNET, PlannerSettings(arrival_interval=0.02, max_workers=2, time_scale=4.0))
    assert planner.stream_bound
    plan = planner.plan(None)
    assert (plan.num_stages, plan.num_workers) == (1, 1)


def test_measured_time_scale_is_the_slowest_live_worker_over_the_profile() -> None:
    plan = Planner(MNISTNET, PlannerSettings(arrival_interval=0.02)).plan(None)
    t = MNISTNET.sequential_time
    assert measured_time_scale(MNISTNET, plan, [None]) is None
    assert measured_time_scale(MNISTNET, plan, [4 * t]) == pytest.approx(4.0)
    # 1 × 1 is never stale: a compensation time is not taken off its service time
    assert measured_time_scale(MNISTNET, plan, [4 * t], 5e-3) == pytest.approx(4.0)


def test_measured_time_scale_leaves_out_the_compensation_the_planner_counts_apart() -> None:
    """A stale plan's workers also compensate each gradient; with that counted in the plan (reading 14) the
    scale is read from the rest, so the compensation is not counted twice."""
    fast = MNISTNET.sequential_time / 2.5
    plan = Planner(MNISTNET, PlannerSettings(arrival_interval=fast, max_stages=1, compensation_time=5e-3)).plan(None)
    assert plan.num_workers > 1
    t = MNISTNET.sequential_time
    assert measured_time_scale(MNISTNET, plan, [4 * t + 5e-3] * plan.num_workers, 5e-3) == pytest.approx(4.0)
    assert measured_time_scale(MNISTNET, plan, [4 * t + 5e-3] * plan.num_workers) == pytest.approx(4 + 5e-3 / t)


def test_drift_replans_when_the_measured_time_scale_leaves_the_ratio() -> None:
    planner = Planner(MNISTNET, PlannerSettings(arrival_interval=1 / 294, max_workers=2))
    switch = SwitchablePlanner(planner)
    scale: list[float | None] = [None]
    requested: list[int | None] = []
    done = threading.Event()

    def request(budget: int | None) -> None:
        requested.append(budget)
        done.set()

    drift = DriftReplanner(switch, lambda: None, ratio=1.5, cooldown_s=0, time_scale=lambda: scale[0])
    drift.start(request)
    try:
        drift.offer(1 / 294)  # no measurement yet, the interval as planned: nothing
        scale[0] = 1.3  # within [1/1.5, 1.5]: nothing
        drift.offer(1 / 294)
        scale[0] = 4.0
        drift.offer(1 / 294)
        assert done.wait(10)
    finally:
        drift.close()
    assert requested == [None] and drift.replans == 1 and drift.scale_replans == 1
    assert switch.current.settings.time_scale == 4.0
    assert switch.current.arrival_interval == pytest.approx(1 / 294)  # the interval did not drift: kept
    assert switch.current.base_profile is MNISTNET
    assert not switch.current.stream_bound


def test_the_live_planner_keeps_the_measured_best_shape_on_cpu() -> None:
    """On CPU executor threads, with neither cap set, the live planner plans 1 stage × 1 worker (more executor
    threads trained fewer items per second there, benchmarks/engine/results/plan_throughput.md); setting
    either cap lifts it."""
    from services.config import load_settings
    from services.trainer.executors import thread_caps
    from services.trainer.runner import make_planner

    assert thread_caps(load_settings(None, env={})) == (1, 1)
    # the paper's rate (a configured interval) plans as the paper does
    assert thread_caps(load_settings(None, env={"FERRET_TRAINER_ARRIVAL_INTERVAL": "auto"}))[1] is None
    assert thread_caps(load_settings(None, env={"FERRET_TRAINER_MAX_WORKERS": "3"})) == (3, None)
    assert thread_caps(load_settings(None, env={"FERRET_TRAINER_MAX_STAGES": "2"}))[1] == 2
    profile = str(ROOT / "benchmarks/profiles/mnistnet.json")
    env = {
        "FERRET_TRAINER_STREAM_RATE": "294",
        "FERRET_TRAINER_PROFILE": profile,
        "FERRET_TRAINER_EXECUTORS": "threads",
    }
    capped = make_planner(load_settings(None, env=env), MNISTNET)
    plan = Planner(capped.base_profile, replace(capped.settings, time_scale=4.0)).plan(None)
    assert (plan.num_stages, plan.num_workers) == (1, 1)  # not stream-bound, and still the measured best
    lifted = make_planner(load_settings(None, env={**env, "FERRET_TRAINER_MAX_WORKERS": "2"}), MNISTNET)
    plan = Planner(lifted.base_profile, replace(lifted.settings, time_scale=4.0)).plan(None)
    assert plan.num_stages * plan.num_workers > 1  # R_F decides once allowed
    with pytest.raises(ConfigError):
        PlannerSettings(max_stages=0)


def test_a_scale_that_keeps_the_plans_shape_swaps_the_planner_without_a_replan() -> None:
    planner = Planner(MNISTNET, PlannerSettings(arrival_interval=1 / 294, max_workers=1, max_stages=1))
    switch = SwitchablePlanner(planner)
    in_force = planner.plan(None)
    requested: list[int | None] = []
    drift = DriftReplanner(
        switch, lambda: None, ratio=1.5, cooldown_s=0, time_scale=lambda: 4.0, plan_in_force=lambda: in_force
    )
    drift.start(requested.append)
    try:
        drift.offer(1 / 294)
        for _ in range(200):
            if switch.current is not planner:
                break
            threading.Event().wait(0.01)
    finally:
        drift.close()
    assert switch.current.settings.time_scale == 4.0 and drift.scale_replans == 1
    assert requested == [] and drift.replans == 0  # the 1 × 1 plan in force runs on, undrained


def test_compensation_time_adds_to_each_stage_backward_in_proportion_to_its_weights() -> None:
    """Reading 14 (ours): a stale gradient's compensation is elementwise work over the stage's weights."""
    from ferret_core.plan import Partition
    from ferret_core.planning.cost_model import StageGeometry

    geometry = StageGeometry.from_profile(MNISTNET, Partition((0, 2, MNISTNET.num_units)))
    per_weight = 1e-9
    stale = geometry.with_compensation(per_weight)
    assert geometry.with_compensation(0.0) is geometry
    for j, (b, w) in enumerate(zip(geometry.backward_times, geometry.weights, strict=True)):
        assert stale.backward_times[j] == pytest.approx(b + per_weight * w)
    assert stale.t_b == max(stale.backward_times) and stale.t_f == geometry.t_f
    with pytest.raises(ProfileError):
        geometry.with_compensation(-1.0)
    with pytest.raises(ConfigError):
        PlannerSettings(compensation_time=math.nan)


def test_a_plan_whose_gradients_are_never_stale_pays_no_compensation() -> None:
    """1 worker × 1 stage: nothing is stale, so its plan is the same with or without the compensation time;
    a plan of several workers counts it, needs more slots to keep up, and has a lower R_F."""
    slow = 1.5 * MNISTNET.sequential_time  # one worker keeps up
    fast = MNISTNET.sequential_time / 2.5  # it does not: Alg. 2 wants 3 workers
    for interval in (slow, fast):
        plain = Planner(MNISTNET, PlannerSettings(arrival_interval=interval, max_stages=1))
        costly = Planner(MNISTNET, PlannerSettings(arrival_interval=interval, max_stages=1, compensation_time=5e-3))
        a, b = plain.plan(None), costly.plan(None)
        if interval == slow:
            assert (a.num_workers, a.stage_backward_time, a.adaptation_rate) == (
                b.num_workers, b.stage_backward_time, b.adaptation_rate,
            )
        else:
            assert a.num_workers == 3 and b.num_workers > a.num_workers
            assert b.stage_backward_time == pytest.approx(a.stage_backward_time + 5e-3)
            assert b.adaptation_rate < a.adaptation_rate
