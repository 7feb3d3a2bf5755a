"""Engine invariants and life-cycle misuse raise ScheduleError (a RuntimeError); a caller's values keep
raising ConfigError (a ValueError), so a service maps the two apart (INTERNAL vs INVALID_ARGUMENT)."""

from __future__ import annotations

import grpc
import pytest
import torch

from ferret_core.engine.buffering import BufferingSettings, WindowFeeder
from ferret_core.engine.snapshot import engine_state
from ferret_core.engine.state import GradientBuffer
from ferret_core.errors import ConfigError, FerretError, ScheduleError
from ferret_core.schedule.actions import Action, Kind
from ferret_core.schedule.flush_scheduler import FlushRules, FlushScheduler
from ferret_core.schedule.scheduler import PlanRules, Scheduler
from services.control.servicer import status_for
from tests.unit.test_engine_support import make_plan, stream
from tests.unit.test_engine_wall import engine_for


def test_schedule_error_is_a_ferret_runtime_error_not_a_config_error() -> None:
    assert issubclass(ScheduleError, FerretError) and issubclass(ScheduleError, RuntimeError)
    assert not issubclass(ScheduleError, ValueError) and not issubclass(ScheduleError, ConfigError)
    # the control plane answers a caller's bad value INVALID_ARGUMENT, an engine's broken invariant INTERNAL
    assert status_for(ConfigError("bad value"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert status_for(ScheduleError("broken")) == (grpc.StatusCode.INTERNAL, "ScheduleError: broken")


def test_the_scheduler_refuses_an_action_out_of_its_life_cycle() -> None:
    scheduler = Scheduler(PlanRules(make_plan(2, 1)))
    scheduler.admit(0, 0, 0)
    scheduler.admit(0, 1, 0)
    with pytest.raises(ScheduleError, match=r"F1 is not the next ready action of executor 0/0.*holds items \[0, 1\]"):
        scheduler.start(Action(Kind.F, 0, 0, 1))
    with pytest.raises(ScheduleError, match="is not running F0"):
        scheduler.finish(Action(Kind.F, 0, 0, 0))
    first = scheduler.next_action(0, 0)
    assert first == Action(Kind.F, 0, 0, 0)
    scheduler.start(first)
    with pytest.raises(ScheduleError, match="already running F0"):
        scheduler.start(Action(Kind.F, 0, 0, 1))
    with pytest.raises(ConfigError, match="is not a stage"):  # a rule's value, not the life cycle
        scheduler.admit(0, 2, 5)


def test_the_flush_scheduler_refuses_an_action_out_of_its_life_cycle() -> None:
    scheduler = FlushScheduler(FlushRules(num_workers=1, num_stages=2, flush_every=1))
    scheduler.admit(0, 0, 0)
    with pytest.raises(ScheduleError, match="admit only when can_admit"):
        scheduler.admit(0, 1, 0)
    with pytest.raises(ScheduleError, match="is not the next ready action"):
        scheduler.start(Action(Kind.B, 0, 0, 0))
    with pytest.raises(ScheduleError, match="is not running F0"):
        scheduler.finish(Action(Kind.F, 0, 0, 0))


def test_an_empty_gradient_buffer_and_an_unready_window_have_nothing_to_take() -> None:
    with pytest.raises(ScheduleError, match="at least one accumulated gradient"):
        GradientBuffer().take()
    feeder = WindowFeeder(BufferingSettings(batch=2, window=4), "last")
    feeder.offer(0, torch.zeros(3), 1)
    with pytest.raises(ScheduleError, match="a step needs 2 items, the window holds 1"):
        feeder.take()


def test_starting_a_wall_clock_twice_is_a_life_cycle_error() -> None:
    engine = engine_for(make_plan(2, 1))
    with engine.wall_clock() as clock, pytest.raises(ScheduleError, match="already started"):
        clock.start()


def test_a_removed_workers_replica_and_an_undrained_engines_state_are_schedule_errors() -> None:
    engine = engine_for(make_plan(2, 2, live=[True, False]))
    with pytest.raises(ScheduleError, match="worker 1 was removed"):
        engine.pipeline.store.replica(1, 0)
    item = stream(1)[0]
    with engine.pipeline.lock:
        assert engine.pipeline.dispatch(0, item.x, item.y, 0) is None
    with pytest.raises(ScheduleError, match="got 1: drain the engine"):
        engine_state(engine)
    with engine.pipeline.lock, pytest.raises(ConfigError, match="item 0 is already in flight"):
        engine.pipeline.dispatch(0, item.x, item.y, 0)  # the caller numbers items: its value, not an invariant
