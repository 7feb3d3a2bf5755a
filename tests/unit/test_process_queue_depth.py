"""The admission queue on executor processes (services/trainer/process_learner.queue_depth): it holds W's
worth of work plus the work one worker can do before the next consumer batch arrives (the measured
delivery interval, clamped), never more than the queue's K."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ferret_core.engine.admission import AdmissionSettings
from services.trainer.process_learner import DELIVERY_JITTER_S, MAX_DELIVERY_S, queue_depth

ADMISSION = AdmissionSettings(max_wait_s=0.005, queue_slots=256, profile_service_s=0.005)


def test_before_any_batch_is_measured_the_queue_covers_the_least_delivery_spread() -> None:
    assert queue_depth(ADMISSION) == math.floor(1 + DELIVERY_JITTER_S / 0.005) == 5


def test_batches_a_third_of_a_second_apart_fill_the_queue_up_to_the_delivery_ceiling() -> None:
    # 0.3 s between batches is clamped to 0.25 s: 50 items of 5 ms, plus W's one
    assert queue_depth(ADMISSION, 0.005, 0.3) == math.floor(1 + MAX_DELIVERY_S / 0.005) == 51
    assert queue_depth(ADMISSION, 0.005, 0.1) == 21  # 100 ms of work: 20 items, + 1


@given(st.floats(1e-4, 0.1), st.floats(0.0, 5.0), st.floats(0.0, 5.0))
def test_the_depth_grows_with_the_delivery_interval_and_stays_within_k(service: float, a: float, b: float) -> None:
    short, long = sorted((a, b))
    assert queue_depth(ADMISSION, service, short) <= queue_depth(ADMISSION, service, long) <= ADMISSION.queue_slots
    ceiling = queue_depth(ADMISSION, service, MAX_DELIVERY_S)
    assert queue_depth(ADMISSION, service, MAX_DELIVERY_S + long) == ceiling  # the training delay it may add is bounded
