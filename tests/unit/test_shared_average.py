"""Gap-Aware's average step in shared memory (:class:`~ferret_core.engine.processes.average.SharedStepAverage`):
the executors of one stage, each with its compensator over the same C and n, fold every master update
whoever made it, and get exactly the C, n and compensated gradients of the thread engine's one
:class:`GapAwareCompensator` per stage on the same sequence of updates. Which compensators take a shared
average, and what process executors refuse. Executors in other processes: the integration tier
(tests/integration/test_process_gap_aware.py)."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.compensation.compensator_registry import _FACTORIES
from ferret_core.compensation.simple import GapAwareCompensator, NoCompensator
from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.processes.average import SharedStepAverage
from ferret_core.engine.processes.settings import ProcessSettings, check_supported, shares_average, shares_deltas
from ferret_core.errors import ConfigError
from ferret_core.schedule.scheduler import PlanRules
from tests.unit.test_engine_equivalence import EXACT
from tests.unit.test_engine_support import make_plan

SHAPES = [(2, 3), (3,)]
PARAMS = [torch.zeros(s) for s in SHAPES]


def _random(gen: torch.Generator, scale: float = 1.0) -> list[Tensor]:
    return [scale * torch.randn(s, generator=gen) for s in SHAPES]


def _executors(average: SharedStepAverage, alpha: float, count: int = 2) -> list[GapAwareCompensator]:
    """``count`` executors' compensators of one stage over its shared average (as each executor builds it)."""
    made = []
    for _ in range(count):
        compensator = make_compensator("gap-aware", PARAMS, CompensatorSettings(alpha=alpha), 2)
        assert isinstance(compensator, GapAwareCompensator)
        compensator.share_average(average.tensors(), average.count)
        made.append(compensator)
    return made


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.lists(st.integers(0, 2), min_size=1, max_size=12),
    st.sampled_from([0.0, 0.5, 0.9, 0.99]),
    st.integers(1, 4),
)
def test_folding_into_the_shared_average_is_the_thread_compensators_fold(
    seed: int, updaters: list[int], alpha: float, tau: int
) -> None:
    """Each update is folded by whichever executor made it (``updaters``); C, n and every executor's
    compensation equal one thread compensator's that observed the same updates."""
    gen = torch.Generator().manual_seed(seed)
    reference = GapAwareCompensator(PARAMS, CompensatorSettings(alpha=alpha), 2)
    average = SharedStepAverage(0, PARAMS)
    executors = _executors(average, alpha, count=3)
    for updater in updaters:
        delta = _random(gen, 0.1)
        reference.observe_update(delta)
        executors[updater].observe_update(delta)
    assert_close(average.tensors(), reference._avg_step, **EXACT)
    assert average.updates == reference._updates == len(updaters)
    theta_then = _random(gen)
    theta_now = [t + 0.3 * d for t, d in zip(theta_then, _random(gen), strict=True)]
    grads = _random(gen)
    expected = reference.compensate(grads, staleness=tau, theta_then=theta_then, theta_now=theta_now)
    for executor in executors:  # any executor of the stage reads the same C and n
        out = executor.compensate(grads, staleness=tau, theta_then=theta_then, theta_now=theta_now)
        assert_close(out, expected, **EXACT)
        assert_close(executor.state_dict()["avg_step"], reference.state_dict()["avg_step"], **EXACT)
        assert executor.state_dict()["updates"] == len(updaters)
    # the compensation did something, so the equality above means something (G > 1 somewhere)
    assert not all(torch.equal(o, g) for o, g in zip(expected, grads, strict=True))


def test_the_shared_average_is_the_papers_formula() -> None:
    """C ← α·C + (1 − α)·|Δθ|, Ĉ = C / (1 − α^n), G = max(1, |θ_now − θ_then| / (Ĉ + ε)), g / G, written out."""
    alpha, eps = 0.9, 1e-12
    average = SharedStepAverage(0, PARAMS)
    (executor,) = _executors(average, alpha, count=1)
    gen = torch.Generator().manual_seed(3)
    c = [torch.zeros(s) for s in SHAPES]
    for _ in range(5):
        delta = _random(gen, 0.1)
        executor.observe_update(delta)
        c = [alpha * ci + (1 - alpha) * d.abs() for ci, d in zip(c, delta, strict=True)]
    assert_close(average.tensors(), c, rtol=1e-6, atol=1e-9)
    theta_then, grads = _random(gen), _random(gen)
    theta_now = [t + 0.5 for t in theta_then]
    gap = [
        torch.clamp_min((now - then).abs() / (ci / (1 - alpha**5) + eps), 1.0)
        for now, then, ci in zip(theta_now, theta_then, c, strict=True)
    ]
    out = executor.compensate(grads, staleness=2, theta_then=theta_then, theta_now=theta_now)
    assert_close(out, [g / s for g, s in zip(grads, gap, strict=True)], rtol=1e-5, atol=1e-7)


def test_before_any_update_and_at_zero_staleness_the_gradient_is_unchanged() -> None:
    average = SharedStepAverage(0, PARAMS)
    (executor,) = _executors(average, 0.9, count=1)
    grads = [torch.ones(s) for s in SHAPES]
    later = [torch.full(s, 5.0) for s in SHAPES]
    assert executor.compensate(grads, staleness=3, theta_then=PARAMS, theta_now=later) == grads  # n = 0
    executor.observe_update([torch.full(s, 0.1) for s in SHAPES])
    out = executor.compensate(grads, staleness=0, theta_then=PARAMS, theta_now=later)
    assert all(o is g for o, g in zip(out, grads, strict=True))


def test_it_travels_to_another_process_as_shared_memory() -> None:
    average = SharedStepAverage(0, PARAMS)
    copy = pickle.loads(pickle.dumps(average))  # the fields a child process rebuilds its views from
    assert [tuple(t.shape) for t in copy.tensors()] == SHAPES
    assert average.count.is_shared() and all(t.is_shared() for t in average.tensors())
    assert average.nbytes() == sum(torch.zeros(s).nbytes for s in SHAPES) + 8
    assert len(average.storages()) == 2  # one flat buffer for the float32 tensors, one for n


def test_only_gap_aware_takes_a_shared_average_and_only_before_its_first_update() -> None:
    average = SharedStepAverage(0, PARAMS)
    settings_ = CompensatorSettings()
    with pytest.raises(ConfigError, match="keeps no running average"):
        NoCompensator(PARAMS, settings_).share_average(average.tensors(), average.count)
    with pytest.raises(ConfigError, match="never stale"):
        GapAwareCompensator(PARAMS, settings_, 0).share_average(average.tensors(), average.count)
    used = GapAwareCompensator(PARAMS, settings_, 2)
    used.observe_update([torch.ones(s) for s in SHAPES])
    with pytest.raises(ConfigError, match="before the first update"):
        used.share_average(average.tensors(), average.count)
    fresh = GapAwareCompensator(PARAMS, settings_, 2)
    with pytest.raises(ConfigError, match="shaped as the stage's parameters"):
        fresh.share_average(average.tensors()[:1], average.count)
    with pytest.raises(ConfigError, match="int64 tensor of shape"):
        fresh.share_average(average.tensors(), torch.zeros(2, dtype=torch.int64))


def _setup() -> PolicySetup:
    plan = make_plan(1, 2, num_units=3)
    return PolicySetup("ferret", plan, PlanRules(plan), instant=False, planned=None)


def test_process_executors_run_gap_aware_over_a_shared_average() -> None:
    check_supported(_setup(), ProcessSettings(compensator="gap-aware"))
    assert shares_average(ProcessSettings(compensator="gap-aware"))
    assert not shares_deltas(ProcessSettings(compensator="gap-aware"))
    for name in ("none", "step-aware", "fisher", "iter-fisher", "iter-fisher-lean", "dc-asgd-a"):
        assert not shares_average(ProcessSettings(compensator=name))


class _OwnFold(NoCompensator):
    """A compensator that folds every update into state of its own (neither a ring nor an average)."""

    name = "own-fold"
    needs_deltas = True


def test_a_compensator_that_folds_into_state_of_its_own_is_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_FACTORIES, "own-fold", lambda params, settings_, _capacity: _OwnFold(params, settings_))
    with pytest.raises(NotImplementedError, match="'own-fold' folds every master update"):
        check_supported(_setup(), ProcessSettings(compensator="own-fold"))
