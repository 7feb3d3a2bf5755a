"""A stage's compensator state read and written through views over its shared memory
(:mod:`ferret_core.engine.processes.stage_state`): what the coordinator does for its own stages and a host's
agent for the stages it owns."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.engine.processes.stage_state import CompensatorSpec, load_state, read_state, stage_view
from ferret_core.engine.processes.tuning import StageTunings
from ferret_core.errors import ScheduleError

SPEC = CompensatorSpec("iter-fisher", CompensatorSettings(eta_lambda=0.05), 2)


def _stage() -> tuple[list[torch.Tensor], SharedDeltas, StageTunings]:
    params = [torch.zeros(3, 2), torch.zeros(2)]
    return params, SharedDeltas(0, params, SPEC.ring_capacity), StageTunings()


def _view(params: list[torch.Tensor], deltas: SharedDeltas, tunings: StageTunings, *, ring: bool = True):  # type: ignore[no-untyped-def]
    tuning = tunings.get(0, params, SPEC.compensator, SPEC.settings, SPEC.ring_capacity)
    return stage_view(SPEC, params, deltas=deltas, average=None, tuning=tuning, ring=ring)


def test_a_state_loaded_through_one_view_is_read_through_another_and_the_shared_ring_stays() -> None:
    params, deltas, tunings = _stage()
    lock = threading.Lock()
    writer = _view(params, deltas, tunings)
    writer.observe_update([torch.ones(3, 2), torch.ones(2)])  # one delta into the stage's shared ring
    grads = [torch.full((3, 2), 0.5), torch.full((2,), 0.5)]
    writer.compensate(grads, staleness=1, theta_then=params, theta_now=[p + 1 for p in params])
    saved = read_state(writer, lock, 0, timeout=1.0)
    assert saved["ring"]["pushed"] == 1
    elsewhere, other_deltas, other_tunings = _stage()  # a new clock's stage: fresh state, an empty ring
    fresh = read_state(_view(elsewhere, other_deltas, other_tunings), lock, 0, timeout=1.0)
    assert fresh["lambda"] == SPEC.settings.lambda0 != saved["lambda"]
    load_state(_view(elsewhere, other_deltas, other_tunings, ring=False), lock, 0, saved, timeout=1.0)
    loaded = read_state(_view(elsewhere, other_deltas, other_tunings), lock, 0, timeout=1.0)
    assert loaded["lambda"] == saved["lambda"]
    assert_close(loaded["v_r"], saved["v_r"])
    assert_close(loaded["v_a"], saved["v_a"])
    assert loaded["ring"]["pushed"] == 0  # the old clock's deltas are not of this clock's versions


@pytest.mark.parametrize("what", ["read", "written"])
def test_a_held_update_lock_is_a_schedule_error_after_the_timeout_not_a_hang(what: str) -> None:
    params, deltas, tunings = _stage()
    lock = threading.Lock()
    view = _view(params, deltas, tunings)
    state = read_state(view, lock, 0, timeout=1.0)
    lock.acquire()  # an executor killed inside its update never releases it
    with pytest.raises(ScheduleError, match=f"stage 0's update lock was not free within 0.05 s.*cannot be {what}"):
        if what == "read":
            read_state(view, lock, 0, timeout=0.05)
        else:
            load_state(_view(params, deltas, tunings, ring=False), lock, 0, state, timeout=0.05)
