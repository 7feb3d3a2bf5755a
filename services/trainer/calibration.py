"""The start-up timing: this machine's time for one item's training step ÷ the profile's, and one compensation.

The planner reads the profile in the machine's time, k = measured ÷ profiled time per item
(``docs/planner.md`` reading 11). Once the workers run, the drift re-planner measures k from their busy
seconds per item; until then the start-up plan was made with k = 1. But a committed profile
(``trainer.profile``) sums the layers' forward and backward kernels on the machine that made it, while a
worker also steps the optimizer and pays Python's per-call costs, on this machine: MNISTNet's profile says
1.09 ms per item where one training step takes ~4 ms on the 2-core machine and ~5 ms on the 16-core host of
the GPU machine. With k = 1 a stream of 392 items/s was planned 1 worker × 1 stage there ("one worker keeps
up"), trained 40 % of the items, and a short stream ended before the measured k could re-plan (10 s
cooldown).

So before it plans, the trainer times a few plain training steps (forward, backward, SGD step; one item,
on the trainer's device and threads) of a copy of its model and starts with k = their median ÷ the
profile's time per item. The copy leaves the model's weights as they were. Within ``max_seconds`` (plus
one step): a ResNet-18 on one CPU thread takes ~0.1 s a step.

It also times one stale gradient's compensation by the trainer's compensator over the whole model
(:func:`compensation_seconds`, τ = 1): the planner adds it to the backward of plans whose gradients can be
stale (``docs/planner.md`` reading 14). Measured on the 16-core GPU host, the calibrated 1 × 2 plan of a
392 items/s stream trained half what 1 × 1 did: each stale MNISTNet gradient's ``iter-fisher-lean`` took
~8.6 ms, more than the ~4.5 ms step, and the plan had not counted it.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.profile import ModelProfile
from ferret_core.zoo import ZooModel

log = logging.getLogger("ferret.trainer")

WARM_STEPS = 2  # first calls: kernel choice, allocator, lazy modules
MIN_STEPS = 3
MAX_STEPS = 20


def median_seconds(call: Callable[[], object], device: torch.device, *, max_seconds: float = 0.5) -> float:
    """Median seconds of ``call()`` on ``device`` (synchronised on CUDA): at least ``MIN_STEPS`` timed calls
    after ``WARM_STEPS``, then until ``max_seconds`` or ``MAX_STEPS``."""

    def timed() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    for _ in range(WARM_STEPS):
        timed()
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < MIN_STEPS or (len(times) < MAX_STEPS and time.perf_counter() - began < max_seconds):
        times.append(timed())
    return float(statistics.median(times))


def step_seconds(model: ZooModel, device: torch.device, *, max_seconds: float = 0.5) -> float:
    """Median seconds of one item's training step (forward, cross-entropy, backward, SGD step) of a copy of
    ``model`` on ``device`` (:func:`median_seconds`)."""
    net = copy.deepcopy(model.as_sequential()).to(device).train()
    opt = torch.optim.SGD(net.parameters(), lr=1e-6)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand((1, *model.input_shape), generator=gen).to(device)
    y = torch.zeros(1, dtype=torch.long, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()

    return median_seconds(step, device, max_seconds=max_seconds)


def compensation_seconds(
    model: ZooModel, compensator: str, device: torch.device, settings: CompensatorSettings | None = None
) -> float:
    """Median seconds of one stale gradient's compensation (τ = 1) by ``compensator`` over all of
    ``model``'s weights on ``device`` (λ tuned as in the trainer: the state the call also updates)."""
    params = [p.detach().to(device) for p in model.as_sequential().parameters()]
    comp = make_compensator(compensator, params, settings or CompensatorSettings(), 1)
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=gen).to(device) for p in params]
    then = [p.clone() for p in params]
    now = [p + 1e-3 * torch.randn(p.shape, generator=gen).to(device) for p in params]
    return median_seconds(lambda: comp.compensate(grads, staleness=1, theta_then=then, theta_now=now), device)


def startup_time_scale(profile: ModelProfile, model: ZooModel, device: torch.device) -> float:
    """k for the start-up plan: :func:`step_seconds` ÷ the profile's time per item, Σ_i (t_i^f + t_i^b)."""
    measured = step_seconds(model, device)
    scale = measured / profile.sequential_time
    log.info(
        "start-up time scale %.3g: one training step takes %.3g ms here, %.3g ms by the profile",
        scale,
        measured * 1e3,
        profile.sequential_time * 1e3,
    )
    return scale
