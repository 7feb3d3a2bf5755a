"""A stage's backward pass split in two, as zero-bubble pipelines run it (Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024; sail-sg/zero-bubble).

``B`` computes only the gradient of the stage's *input* — what the stage below waits for — and keeps the
graph (``retain_graph=True``); ``W`` computes the gradients of the stage's *parameters* later, from the
same retained graph and the same output gradient, whenever the schedule finds a bubble for it. Both run
on the item's stashed version (the graph saved its tensors at the forward), so ``W`` equals the weight
half of the fused :func:`ferret_core.engine.stage_exec.backward` to rounding.

Our ``W`` walks the graph from the output again (PyTorch offers no public way to keep the intermediate
activation gradients of the first walk), so it repeats the activation-gradient chain of ``B``: real
compute of a split stage is more than the fused pass, which only the wall clock sees. The virtual clock
charges the profile's t̂^b once, split between B and W (:class:`~ferret_core.engine.schedules.FlushRules`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ferret_core.engine.stage_exec import StageGraph
from ferret_core.errors import ScheduleError


def backward_root(
    graph: StageGraph, *, target: Tensor | None = None, loss: Callable[[Tensor], Tensor] | None = None
) -> Tensor:
    """What the stage's backward starts from: the loss on the last stage (``loss`` of its output, e.g. an
    OCL algorithm's, else cross-entropy against ``target``), its output elsewhere (paired with the output
    gradient from the stage above)."""
    if loss is not None:
        return loss(graph.output)
    if target is None:
        return graph.output
    return F.cross_entropy(graph.output, target)


def input_gradient(graph: StageGraph, root: Tensor, grad_output: Tensor | None) -> Tensor:
    """B: the gradient of the stage input, keeping the graph for :func:`weight_gradients`."""
    if not graph.input.requires_grad:
        raise ScheduleError(
            "B of a split backward needs a stage input that requires grad, got one that does not: at the "
            "item's lowest back-propagated stage, run the fused backward (W), not B (a bug)"
        )
    (grad_in,) = torch.autograd.grad(root, (graph.input,), grad_outputs=grad_output, retain_graph=True)
    return grad_in


def weight_gradients(graph: StageGraph, root: Tensor, grad_output: Tensor | None) -> tuple[Tensor, ...]:
    """W: the gradients of the stage's parameters from the graph :func:`input_gradient` kept (freed now)."""
    grads = torch.autograd.grad(
        root, graph.leaves, grad_outputs=grad_output, allow_unused=True, materialize_grads=True
    )
    return tuple(grads)
