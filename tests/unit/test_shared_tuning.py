"""A stage compensator's tuning state in shared memory (:class:`~ferret_core.engine.processes.tuning.SharedTuning`):
the executors of one stage, each with its own compensator over the same λ and EMAs (Iter-Fisher's family) or
mean square (DC-ASGD-a), compensate exactly as the thread engine's one compensator per stage does on the
same sequence of gradients, whichever executor each gradient comes from. Without the shared state they do
not (the case this fixes). Which compensators keep such state, and the refusals. Executors in other
processes: tests/integration/test_process_tuning.py."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings, StageCompensator, make_compensator
from ferret_core.compensation.compensator_registry import COMPENSATOR_NAMES
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.engine.processes.tuning import SharedTuning, StageTunings
from ferret_core.errors import ConfigError
from tests.unit.test_engine_equivalence import EXACT

SHAPES = [(2, 3), (3,)]
PARAMS = [torch.zeros(s) for s in SHAPES]
BOUND = 3  # the stage's staleness bound (ring capacity)
TUNED = ("iter-fisher", "iter-fisher-cf", "iter-fisher-lean", "dc-asgd-a")
# λ steps large enough to move λ visibly within a dozen calls (the default 2e-6 moves it by ~1e-7)
SETTINGS = CompensatorSettings(eta_lambda=0.05, alpha=0.5, dc_lambda0=2.0)


def _random(gen: torch.Generator, scale: float = 1.0) -> list[Tensor]:
    return [scale * torch.randn(s, generator=gen) for s in SHAPES]


def _stage(name: str, executors: int, *, shared: bool) -> tuple[StageCompensator, list[StageCompensator]]:
    """The thread engine's one compensator of the stage, and ``executors`` executors' compensators of it, each
    built as an executor builds its own, over the stage's shared delta ring (where Alg. 1 walks one) and — with
    ``shared`` — its shared tuning state."""
    reference = make_compensator(name, PARAMS, SETTINGS, BOUND)
    tuning = SharedTuning(0, make_compensator(name, PARAMS, SETTINGS, BOUND).tuning_state())
    deltas = SharedDeltas(0, PARAMS, BOUND)
    made = []
    for _ in range(executors):
        compensator = make_compensator(name, PARAMS, SETTINGS, BOUND)
        compensator.share_ring(deltas.ring())
        if shared:
            compensator.share_tuning_state(tuning.tensors())
        made.append(compensator)
    return reference, made


def _calls(seed: int, callers: list[int], staleness: list[int]) -> list[tuple[int, list[Tensor], int, list[Tensor]]]:
    """(caller, Δθ of the master update before the call, τ, the gradient) per call."""
    gen = torch.Generator().manual_seed(seed)
    return [(c, _random(gen, 0.1), tau, _random(gen)) for c, tau in zip(callers, staleness, strict=False)]


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(TUNED),
    st.integers(0, 2**31 - 1),
    st.lists(st.integers(0, 2), min_size=2, max_size=12),
    st.lists(st.integers(0, BOUND), min_size=12, max_size=12),
)
def test_executors_over_the_shared_tuning_state_compensate_as_one_compensator(
    name: str, seed: int, callers: list[int], staleness: list[int]
) -> None:
    """Each gradient goes to whichever executor ``callers`` names (its master update pushed by the same one);
    every output, and λ, equal the one compensator's that saw the same calls."""
    reference, executors = _stage(name, 3, shared=True)
    theta = [torch.randn(s, generator=torch.Generator().manual_seed(seed + 1)) for s in SHAPES]
    history = [theta]
    for caller, delta, tau, grads in _calls(seed, callers, staleness):
        theta = [t + d for t, d in zip(theta, delta, strict=True)]
        history.append(theta)
        reference.observe_update(delta)
        executors[caller].observe_update(delta)  # the executor that made the update pushes it (Alg. 1's ring)
        then = history[max(0, len(history) - 1 - tau)]
        expected = reference.compensate(grads, staleness=tau, theta_then=then, theta_now=theta)
        out = executors[caller].compensate(grads, staleness=tau, theta_then=then, theta_now=theta)
        assert_close(out, expected, **EXACT)
    for executor in executors:
        assert executor.stats()["lambda"] == reference.stats()["lambda"]
        assert_close(executor.tuning_state(), reference.tuning_state(), **EXACT)


@pytest.mark.parametrize("name", TUNED)
def test_without_the_shared_state_executors_learn_apart_and_compensate_otherwise(name: str) -> None:
    """The case the shared state fixes: two executors with state of their own each learn from half the
    stage's gradients, so their λ (or mean square) and outputs leave the one compensator's."""
    reference, executors = _stage(name, 2, shared=False)
    theta = [torch.zeros(s) for s in SHAPES]
    history = [theta]
    differs = False
    for i, (_, delta, _, grads) in enumerate(_calls(7, [0, 1] * 6, [1] * 12)):
        theta = [t + d for t, d in zip(theta, delta, strict=True)]
        history.append(theta)
        reference.observe_update(delta)
        executors[i % 2].observe_update(delta)
        expected = reference.compensate(grads, staleness=1, theta_then=history[-2], theta_now=theta)
        out = executors[i % 2].compensate(grads, staleness=1, theta_then=history[-2], theta_now=theta)
        differs |= not all(torch.equal(o, e) for o, e in zip(out, expected, strict=True))
    assert differs


def test_it_starts_at_the_prototypes_values_and_travels_as_shared_memory() -> None:
    prototype = make_compensator("iter-fisher", PARAMS, SETTINGS, BOUND).tuning_state()
    tuning = SharedTuning(0, prototype)
    assert float(tuning.tensors()[0]) == SETTINGS.lambda0  # λ⁰, not zero
    assert int(tuning.tensors()[1][0]) == 0  # v_a not yet seen non-zero
    assert all(t.is_shared() for t in tuning.tensors())
    copy = pickle.loads(pickle.dumps(tuning))  # the fields a child process rebuilds its views from
    assert [(tuple(t.shape), t.dtype) for t in copy.tensors()] == [(tuple(t.shape), t.dtype) for t in prototype]
    # λ (float64), the flag (int64), v_r and v_a (float32): one flat buffer per dtype
    assert len(tuning.storages()) == 3
    assert tuning.nbytes() == 8 + 8 + 2 * sum(torch.zeros(s).nbytes for s in SHAPES)


@pytest.mark.parametrize("name", sorted(COMPENSATOR_NAMES))
def test_which_compensators_keep_a_tuning_state(name: str) -> None:
    """Iter-Fisher's family (where λ is tuned) and DC-ASGD-a, at a stage that can be stale; nothing at a stage
    that is never stale, and nothing for compensators that learn nothing from gradients (Gap-Aware's C folds
    the master's updates and is shared apart)."""
    tunings = StageTunings()
    keeps = tunings.get(0, PARAMS, name, SETTINGS, BOUND) is not None
    assert keeps == (name in TUNED)
    assert (0 in tunings) == keeps
    assert StageTunings().get(0, PARAMS, name, SETTINGS, 0) is None  # never stale: nothing kept
    fixed = CompensatorSettings(eta_lambda=0.0)  # λ fixed at λ⁰: Alg. 1 keeps no v_r, v_a
    assert (make_compensator(name, PARAMS, fixed, BOUND).tuning_state() != []) == (
        name in ("iter-fisher-cf", "dc-asgd-a")
    )


def test_a_stage_keeps_one_state_for_every_executor() -> None:
    tunings = StageTunings()
    first = tunings.get(0, PARAMS, "dc-asgd-a", SETTINGS, BOUND)
    assert first is not None and tunings.get(0, PARAMS, "dc-asgd-a", SETTINGS, BOUND) is first
    assert tunings.nbytes() == first.nbytes() == 8 + sum(torch.zeros(s).nbytes for s in SHAPES)


def test_a_tuning_state_is_shared_only_before_the_first_call_and_only_as_shaped() -> None:
    tuning = SharedTuning(0, make_compensator("dc-asgd-a", PARAMS, SETTINGS, BOUND).tuning_state())
    with pytest.raises(ConfigError, match="no tuning state to share"):
        make_compensator("fisher", PARAMS, SETTINGS, BOUND).share_tuning_state(tuning.tensors())
    with pytest.raises(ConfigError, match="no tuning state to share"):
        make_compensator("dc-asgd-a", PARAMS, SETTINGS, 0).share_tuning_state(tuning.tensors())
    used = make_compensator("dc-asgd-a", PARAMS, SETTINGS, BOUND)
    used.compensate([torch.ones(s) for s in SHAPES], staleness=0, theta_then=PARAMS, theta_now=PARAMS)
    with pytest.raises(ConfigError, match="before the first call"):
        used.share_tuning_state(tuning.tensors())
    with pytest.raises(ConfigError, match="shaped and typed as"):
        make_compensator("dc-asgd-a", PARAMS, SETTINGS, BOUND).share_tuning_state(tuning.tensors()[:2])


def test_a_snapshot_loaded_into_one_executor_is_every_executors_state() -> None:
    """``load_state_dict`` writes into the shared storage (in place), so a restored λ and its EMAs are the
    stage's, not one executor's."""
    source = make_compensator("iter-fisher-lean", PARAMS, SETTINGS, BOUND)
    gen = torch.Generator().manual_seed(5)
    for _ in range(4):
        theta_then, grads = _random(gen), _random(gen)
        theta_now = [t + 0.1 for t in theta_then]
        source.compensate(grads, staleness=2, theta_then=theta_then, theta_now=theta_now)
    _, (one, other) = _stage("iter-fisher-lean", 2, shared=True)
    one.load_state_dict(source.state_dict())
    assert other.stats()["lambda"] == source.stats()["lambda"] != SETTINGS.lambda0
    assert_close(other.tuning_state(), source.tuning_state(), **EXACT)
