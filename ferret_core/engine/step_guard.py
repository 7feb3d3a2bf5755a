"""The norm guard: a bound on one optimizer step's size relative to the weights it changes.

One stretch of extreme inputs (in range, e.g. pixels of ±1000) gives gradients whose plain SGD step
``lr·‖g‖`` is many times the weights' own norm; a few hundred such steps grow the weights until a forward
pass overflows float32 (docs/reliability.md "Diverged weights"). The guard scales a stage's step so that

    ‖Δθ‖ = lr·‖g‖ ≤ r · max(‖θ‖, 1)                                                    (norms over the stage)

with ``r`` the configured ratio (``max_step_ratio``); the floor 1 lets a stage whose weights are (near)
zero still move. A step within the bound is returned unchanged (the same tensors): on a normal stream the
guard costs two norms per update (0.61 ms on MNISTNet's 1.2 M weights, benchmarks/guard) and changes
nothing. A tensor's norm that overflows float32 (finite entries of ~1e30, as such inputs give) is taken
again in float64: an inf norm would otherwise pass the step through unbounded. Non-finite gradients are
left to the engine's own non-finite guard (they are dropped before any update), so this function never
turns them into NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ferret_core.errors import ConfigError


def check_ratio(max_step_ratio: float | None) -> None:
    """``None`` (no bound) or a positive finite ratio."""
    if max_step_ratio is not None and not (math.isfinite(max_step_ratio) and max_step_ratio > 0):
        raise ConfigError(
            f"max_step_ratio must be a positive finite ratio (or None: no bound), got {max_step_ratio}; "
            "e.g. 0.05 lets one step change a stage's weights by at most 5 % of their norm"
        )


def step_scale(params: Sequence[Tensor], grads: Sequence[Tensor], lr: float, max_step_ratio: float) -> float:
    """The factor in (0, 1] that brings the step ``lr·grads`` within ``max_step_ratio`` of ``params``'
    norm (1.0: within the bound already, or not finite: left to the non-finite guard)."""
    if not grads:
        return 1.0
    with torch.no_grad():
        step = lr * _norm(grads)
        if not math.isfinite(step) or step == 0.0:
            return 1.0
        weights = _norm(params)
    bound = max_step_ratio * max(weights, 1.0)
    return 1.0 if step <= bound else bound / step


def _norm(tensors: Sequence[Tensor]) -> float:
    """The 2-norm of all the tensors together: per tensor in its own dtype (one ``_foreach_norm``), again in
    float64 for a tensor whose norm overflowed (finite entries too large to square in float32), then
    combined in float64."""
    norms = [float(n) for n in torch._foreach_norm(list(tensors))]
    norms = [
        n if math.isfinite(n) else float(torch.linalg.vector_norm(t, dtype=torch.float64))
        for n, t in zip(norms, tensors, strict=True)
    ]
    return math.sqrt(sum(n * n for n in norms))


def bounded(
    params: Sequence[Tensor], grads: Sequence[Tensor], lr: float, max_step_ratio: float | None
) -> Sequence[Tensor]:
    """``grads`` scaled so the SGD step ``lr·grads`` stays within the bound (the same tensors when it does,
    or when ``max_step_ratio`` is None)."""
    if max_step_ratio is None:
        return grads
    scale = step_scale(params, grads, lr, max_step_ratio)
    if scale == 1.0:
        return grads
    return [g * scale for g in grads]
