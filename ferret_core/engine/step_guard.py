"""The norm guard: a bound on one optimizer step's size relative to the weights it changes.

One stretch of extreme inputs (in range, e.g. pixels of ±1000) gives gradients whose plain SGD step
``lr·‖g‖`` is many times the weights' own norm; a few hundred such steps grow the weights until a forward
pass overflows float32 (docs/reliability.md "Diverged weights"). The guard scales a stage's step so that

    ‖Δθ‖ = lr·‖g‖ ≤ r · max(‖θ‖, 1)                                                    (norms over the stage)

with ``r`` the configured ratio (``max_step_ratio``); the floor 1 lets a stage whose weights are (near)
zero still move. A step within the bound is returned unchanged (the same tensors): on a normal stream the
guard changes nothing and costs one norm per update, the gradient's (0.22 ms on MNISTNet's 1.2 M values,
one ``_foreach_norm``). The weights' norm is taken only when the step exceeds ``r`` itself: below that it
is within the bound whatever ‖θ‖ is (the floor makes the bound at least ``r``), the same answer without
the second pass (before: two norms, 0.61 ms, benchmarks/guard). A caller that already knows the
gradient's norm (the process executor measures it with its non-finite check, :func:`finite_norm`) passes
it, and the guard reads no gradient at all.

A tensor's norm that overflows float32 (finite entries of ~1e30, as such inputs give) is taken again in
float64: an inf norm would otherwise pass the step through unbounded. Non-finite gradients are left to
the engine's own non-finite guard (they are dropped before any update), so this function never turns
them into NaN.
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


def step_scale(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    lr: float,
    max_step_ratio: float,
    grad_norm: float | None = None,
) -> float:
    """The factor in (0, 1] that brings the step ``lr·grads`` within ``max_step_ratio`` of ``params``'
    norm (1.0: within the bound already, or not finite: left to the non-finite guard). ``grad_norm``:
    ``grads``' 2-norm where the caller measured it (:func:`finite_norm`), else it is taken here."""
    if not grads:
        return 1.0
    with torch.no_grad():
        step = lr * (_norm(grads) if grad_norm is None else grad_norm)
        if not math.isfinite(step) or step == 0.0 or step <= max_step_ratio:
            return 1.0  # step ≤ r ≤ r·max(‖θ‖, 1): within the bound without reading the weights
        weights = _norm(params)
    bound = max_step_ratio * max(weights, 1.0)
    return 1.0 if step <= bound else bound / step


def _tensor_norms(tensors: Sequence[Tensor]) -> list[float]:
    """Each tensor's 2-norm: in its own dtype (one ``_foreach_norm``), again in float64 for a tensor whose
    norm is not finite (finite entries too large to square in float32 overflow it; a NaN or ±inf entry
    keeps it NaN or inf). On an accelerator the norms are read back together (one sync per call, as
    ``all_finite``'s one sum), not one per tensor."""
    found = torch._foreach_norm(list(tensors)) if tensors else []
    if found and found[0].device.type != "cpu" and len({n.device for n in found}) == 1:
        norms = torch.stack([n.double() for n in found]).tolist()
    else:
        norms = [float(n) for n in found]
    return [
        n if math.isfinite(n) else float(torch.linalg.vector_norm(t, dtype=torch.float64))
        for n, t in zip(norms, tensors, strict=True)
    ]


def _norm(tensors: Sequence[Tensor]) -> float:
    """The 2-norm of all the tensors together (:func:`_tensor_norms`, combined in float64)."""
    return math.sqrt(sum(n * n for n in _tensor_norms(tensors)))


def finite_norm(tensors: Sequence[Tensor]) -> float | None:
    """The 2-norm of all the tensors together (as :func:`_norm`), or None when an element is NaN or ±inf:
    the non-finite check and the guard's gradient norm in one pass. A tensor's float64 norm is finite iff
    every element is, except a float64 tensor too large to square, which is checked exactly (``aminmax``:
    NaN propagates to both ends, ±inf is an end)."""
    norms = _tensor_norms(tensors)
    for n, t in zip(norms, tensors, strict=True):
        if not math.isfinite(n):
            low, high = torch.aminmax(t)
            if not (math.isfinite(float(low)) and math.isfinite(float(high))):
                return None
    return math.sqrt(sum(n * n for n in norms))


def bounded(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    lr: float,
    max_step_ratio: float | None,
    grad_norm: float | None = None,
) -> Sequence[Tensor]:
    """``grads`` scaled so the SGD step ``lr·grads`` stays within the bound (the same tensors when it does,
    or when ``max_step_ratio`` is None); ``grad_norm``: their 2-norm where the caller measured it."""
    if max_step_ratio is None:
        return grads
    scale = step_scale(params, grads, lr, max_step_ratio, grad_norm)
    if scale == 1.0:
        return grads
    return [g * scale for g in grads]
