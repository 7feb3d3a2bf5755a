"""Out-of-place optimizers for the master stages (DESIGN §2, §3.11).

The master is never written in place (a live graph may have saved its tensors), so an optimizer here
maps (stage, current parameters, gradient) to *new* parameter tensors. Its state (momentum buffers) is
per stage, shared by every worker because it belongs to the master, and reported through
:meth:`Optimizer.state_tensors` for the memory measurement.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from ferret_core.engine.step_guard import bounded, check_ratio
from ferret_core.errors import ConfigError, ScheduleError


class Optimizer(Protocol):
    """What the engine needs of an optimizer; calls for one stage are serialised by the engine."""

    def step(
        self,
        stage: int,
        params: Sequence[Tensor],
        grads: Sequence[Tensor],
        out: Sequence[Tensor] | None = None,
        grad_norm: float | None = None,
    ) -> list[Tensor]:
        """New parameters of ``stage``; written into ``out`` (free storage of the right shapes) if given;
        ``grad_norm``: ``grads``' 2-norm where the caller measured it (for the norm guard)."""
        ...

    def state_tensors(self) -> Iterator[Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SGD:
    """Plain SGD, optionally with heavy-ball momentum (PyTorch's ``torch.optim.SGD`` formula, no dampening):
    ``b ← μ·b + g`` (``b = g`` at the first step), ``θ ← θ − lr·b``; without momentum ``θ ← θ − lr·g``,
    computed as ``torch.sub(θ, g, alpha=lr)``, bit-identical to ``θ.sub_(g, alpha=lr)``; into given storage
    (``out``) as one ``torch._foreach_add_`` over all tensors, bit-identical to that. ``max_step_ratio``: the
    norm guard's bound on each step (:mod:`ferret_core.engine.step_guard`; None: unbounded)."""

    def __init__(self, lr: float = 1e-3, momentum: float = 0.0, max_step_ratio: float | None = None) -> None:
        if not (math.isfinite(lr) and lr > 0):
            raise ConfigError(f"learning rate must be a positive number, got {lr}")
        if not (math.isfinite(momentum) and 0 <= momentum < 1):
            raise ConfigError(f"momentum must lie in [0, 1), got {momentum}")
        check_ratio(max_step_ratio)
        self.lr = lr
        self.momentum = momentum
        self.max_step_ratio = max_step_ratio  # the norm guard (:mod:`ferret_core.engine.step_guard`)
        self._buffers: dict[int, list[Tensor]] = {}

    def step(
        self,
        stage: int,
        params: Sequence[Tensor],
        grads: Sequence[Tensor],
        out: Sequence[Tensor] | None = None,
        grad_norm: float | None = None,
    ) -> list[Tensor]:
        with torch.no_grad():
            if self.momentum:
                grad_norm = None  # the step is the momentum buffer's, not the gradient's
                old = self._buffers.get(stage)
                if old is None:
                    bufs = [g.clone() for g in grads]
                else:
                    bufs = [torch.add(g, b, alpha=self.momentum) for b, g in zip(old, grads, strict=True)]
                self._buffers[stage] = bufs
                grads = bufs
            if len(params) != len(grads) or (out is not None and len(out) != len(params)):
                raise ScheduleError(
                    f"SGD step of stage {stage}: {len(params)} parameters, {len(grads)} gradients"
                    + ("" if out is None else f", {len(out)} output tensors")
                    + "; they must match one to one"
                )
            grads = bounded(params, grads, self.lr, self.max_step_ratio, grad_norm)
            if out is None:
                return [torch.sub(p, g, alpha=self.lr) for p, g in zip(params, grads, strict=True)]
            # θ − lr·g for every tensor in two torch calls instead of one per tensor (each call on the
            # executor's thread hands the GIL to the record path's thread): θ copied into ``out`` (a no-op
            # where ``out`` is θ's own storage, the in-place update), then ``out += (−lr)·g``, which is the
            # kernel torch.sub(θ, g, alpha=lr) runs (ATen's sub is add with −alpha): bit-identical (test)
            out = list(out)
            copies = [(o, p) for o, p in zip(out, params, strict=True) if o is not p]
            if copies:
                torch._foreach_copy_([o for o, _ in copies], [p for _, p in copies])
            torch._foreach_add_(out, list(grads), alpha=-self.lr)
            return out

    def state_tensors(self) -> Iterator[Tensor]:
        for bufs in list(self._buffers.values()):
            yield from bufs

    def state_dict(self) -> dict[str, Any]:
        return {
            "lr": self.lr,
            "momentum": self.momentum,
            "buffers": {stage: [b.clone() for b in bufs] for stage, bufs in self._buffers.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr = float(state["lr"])
        self.momentum = float(state["momentum"])
        self._buffers = {int(k): [b.clone() for b in v] for k, v in state["buffers"].items()}
