"""The math of the OCL algorithms as plain functions (STYLE lesson 7)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def distillation_loss(output: Tensor, teacher: Tensor, temperature: float, classes: Tensor | None = None) -> Tensor:
    """LwF's knowledge-distillation term (Li & Hoiem 2017; Avalanche's ``LwFPlugin``):
    KL(softmax(teacher/T) ‖ softmax(output/T)), batch mean, over the ``classes`` mask (the teacher's
    seen classes; all when ``None``)."""
    if classes is not None:
        output, teacher = output[:, classes], teacher[:, classes]
    log_p = torch.log_softmax(output / temperature, dim=1)
    q = torch.softmax(teacher.to(output.device, output.dtype) / temperature, dim=1)
    return F.kl_div(log_p, q, reduction="batchmean")


def output_norm(output: Tensor) -> Tensor:
    """MAS's objective (Aljundi et al. 2018): the squared L2 norm of the output, batch mean; its gradient's
    magnitude is a parameter's importance."""
    return output.pow(2).sum(dim=1).mean()


def decayed_importance(previous: Tensor | None, gradient: Tensor, decay: float) -> Tensor:
    """Ω ← α·Ω + (1 − α)·|∇| (the first estimate is |∇|), a new tensor (the old one may be read)."""
    fresh = gradient.abs()
    return fresh if previous is None else torch.add(previous * decay, fresh, alpha=1 - decay)


def mas_penalty_gradient(importance: Tensor, params: Tensor, anchor: Tensor, strength: float) -> Tensor:
    """∂/∂θ of λ·Σ Ω ⊙ (θ − θ*)²: 2λ·Ω ⊙ (θ − θ*)."""
    return (2 * strength) * importance * (params - anchor)


def interference(pre: Tensor, post: Tensor, count: int) -> Tensor:
    """MIR's choice (Aljundi et al. 2019): the ``count`` candidates whose loss rises most after the virtual
    step (post − pre), as indices in decreasing order of the rise (ties: the lower index)."""
    rise = post - pre
    order = sorted(range(rise.numel()), key=lambda i: (-float(rise[i]), i))
    return torch.tensor(order[:count], dtype=torch.long)


def per_sample_cross_entropy(output: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(output, target.to(output.device), reduction="none")
