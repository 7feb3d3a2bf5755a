"""Forward, backward and recompute of one pipeline stage on a given version (DESIGN §2, "PyTorch mechanics").

A stage is a run of consecutive model units. Its module is kept as a *template on the meta device*: the
engine never uses the module's own tensors. Every pass binds the tensors of an explicit
:class:`~ferret_core.engine.versions.StageVersion` into a copy of the template for the call (what
``torch.func.functional_call(module, tensors, (x,), tie_weights=False)`` does, without its per-call
bookkeeping), gradients come from ``torch.autograd.grad`` (never ``.grad``, which concurrent backward
passes would mix), and the recompute of T1 is simply another forward on the *stashed* version
(``torch.utils.checkpoint`` would recompute with current weights).

Binding swaps tensors on the module object while it runs, so two threads must never share one: each
executor gets its own :class:`StageRunner` (a cheap copy of the meta template). Every parameter and
buffer is bound by name (the zoo's units have no tied weights; a name the module lacks fails when the
runner is made). Modules that mutate state
in a forward (BatchNorm in train mode updates its running statistics in place) are rejected; stochastic
modules (Dropout) are rejected where a recompute would draw a different mask.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ConfigError, ScheduleError
from ferret_core.plan import Partition

_STOCHASTIC = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


@dataclass(frozen=True, eq=False)
class StageProgram:
    """The structure of stage ``index``: a meta-device template and the names of its tensors."""

    index: int
    template: nn.Module
    param_names: tuple[str, ...]
    buffer_names: tuple[str, ...]

    def runner(self) -> StageRunner:
        return StageRunner(self)


class StageRunner:
    """Runs one stage's template on given tensors; one per executor (not thread-safe).

    The tensors are bound straight into the runner's own copy of the template (each parameter and buffer
    slot, resolved once) for the call and the meta tensors put back after it, so the runner holds no
    reference to a version between calls: what ``functional_call(..., tie_weights=False)`` does, without
    its per-call bookkeeping (~35 µs per call on the MLP, of a ~95 µs forward; the outputs and gradients
    are the same, ``tests/unit/test_stage_exec.py``)."""

    def __init__(self, program: StageProgram) -> None:
        self.program = program
        self.module = copy.deepcopy(program.template)
        self._num_params = len(program.param_names)
        self._num_buffers = len(program.buffer_names)
        self._slots = [_slot(self.module, name, "_parameters") for name in program.param_names] + [
            _slot(self.module, name, "_buffers") for name in program.buffer_names
        ]  # parameters, then buffers: the order ``__call__`` binds them in

    def __call__(self, params: Sequence[Tensor], buffers: Sequence[Tensor], x: Tensor) -> Tensor:
        if len(params) != self._num_params or len(buffers) != self._num_buffers:
            raise ScheduleError(
                f"stage {self.program.index} has {self._num_params} parameters and {self._num_buffers} "
                f"buffers, got {len(params)} and {len(buffers)}"
            )
        slots = self._slots
        tensors = [*params, *buffers]
        kept = [table[leaf] for table, leaf in slots]
        try:
            for (table, leaf), tensor in zip(slots, tensors, strict=True):
                table[leaf] = tensor
            out = self.module(x)
        finally:
            for (table, leaf), meta in zip(slots, kept, strict=True):
                table[leaf] = meta
        if not isinstance(out, Tensor):
            raise ConfigError(f"stage {self.program.index} must map one tensor to one tensor, got {type(out).__name__}")
        return out


def _slot(module: nn.Module, name: str, table: str) -> tuple[dict[str, Any], str]:
    """The dict (a module's ``_parameters`` or ``_buffers``) and key that hold tensor ``name``."""
    prefix, _, leaf = name.rpartition(".")
    owner = module.get_submodule(prefix) if prefix else module
    tensors: dict[str, Any] = getattr(owner, table)
    if leaf not in tensors:
        raise ConfigError(f"the stage module has no {table[1:-1]} {name!r}")
    return tensors, leaf


def build_stages(
    units: Sequence[nn.Module],
    partition: Partition,
    devices: Sequence[torch.device] | None = None,
    *,
    allow_stochastic: bool = True,
) -> tuple[list[StageProgram], list[StageVersion]]:
    """Split ``units`` by ``partition`` into stage programs and their version-0 tensors.

    The units are copied (the caller's modules are left untouched). ``devices[j]`` holds stage j's
    tensors (default: where the units are).
    """
    if partition.num_units != len(units):
        raise ConfigError(
            f"the partition covers {partition.num_units} units but the model has {len(units)}; "
            "plan with the profile of this model"
        )
    if devices is not None and len(devices) != partition.num_stages:
        raise ConfigError(f"need one device per stage ({partition.num_stages}), got {len(devices)}")
    programs: list[StageProgram] = []
    versions: list[StageVersion] = []
    for j, stage_units in enumerate(partition.stages):
        module = nn.Sequential(*(copy.deepcopy(units[u]) for u in stage_units))
        _check_module(module, j, allow_stochastic)
        device = None if devices is None else devices[j]
        params = tuple(p.detach().clone().to(device) for p in module.parameters())
        buffers = tuple(b.detach().clone().to(device) for b in module.buffers())
        param_names = tuple(name for name, _ in module.named_parameters())
        buffer_names = tuple(name for name, _ in module.named_buffers())
        programs.append(StageProgram(j, module.to("meta"), param_names, buffer_names))
        versions.append(StageVersion(j, 0, params, buffers))
    return programs, versions


def _check_module(module: nn.Module, stage: int, allow_stochastic: bool) -> None:
    for name, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.training and sub.track_running_stats:
            raise ConfigError(
                f"stage {stage}: {name or 'module'} is a BatchNorm in train mode, which updates its running "
                "statistics in place; use GroupNorm or an eval-mode BatchNorm (zoo norm='batch-eval')"
            )
        if not allow_stochastic and sub.training and isinstance(sub, _STOCHASTIC):
            raise ConfigError(
                f"stage {stage}: {name} draws a random mask, so a recompute (T1) would differ from the "
                "forward; call eval() on it or plan without recomputation"
            )


@dataclass(eq=False, slots=True)
class StageGraph:
    """A forward pass kept for its backward: the (detached) input, the output and the parameter leaves."""

    input: Tensor
    output: Tensor
    leaves: tuple[Tensor, ...]


def forward_no_grad(runner: StageRunner, version: StageVersion, x: Tensor) -> Tensor:
    """Forward without autograd (nothing saved): T1's forward, T3's omitted stages, predictions."""
    with torch.no_grad():
        return runner(version.params, version.buffers, x)


def forward_with_grad(runner: StageRunner, version: StageVersion, x: Tensor, *, input_grad: bool) -> StageGraph:
    """Forward that keeps its graph; ``input_grad`` when the stage below wants the input's gradient."""
    # an input that needs no gradient and is no graph's output is used as it is: two torch calls less per
    # forward on the executor's thread (each hands the GIL to the record path's thread)
    x_in = x if not input_grad and not x.requires_grad else x.detach().requires_grad_(input_grad)
    leaves = tuple(p.detach().requires_grad_(True) for p in version.params)
    with torch.enable_grad():
        out = runner(leaves, version.buffers, x_in)
    return StageGraph(x_in, out, leaves)


def backward(
    graph: StageGraph,
    *,
    grad_output: Tensor | None = None,
    target: Tensor | None = None,
    loss: Callable[[Tensor], Tensor] | None = None,
) -> tuple[tuple[Tensor, ...], Tensor | None]:
    """Parameter gradients and the input's gradient (``None`` when not requested) of one stage.

    The last stage passes ``target`` (loss = cross-entropy of its output) or ``loss`` (a function of its
    output, e.g. an OCL algorithm's); the others ``grad_output``. The graph is freed.
    """
    if sum(v is not None for v in (grad_output, target, loss)) != 1:
        raise ScheduleError("backward needs exactly one of grad_output (inner stage) and target or loss (last stage)")
    inputs = graph.leaves + ((graph.input,) if graph.input.requires_grad else ())
    if loss is not None:
        root = loss(graph.output)
        grads = torch.autograd.grad(root, inputs, allow_unused=True, materialize_grads=True)
    elif target is not None:
        root = F.cross_entropy(graph.output, target)
        grads = torch.autograd.grad(root, inputs, allow_unused=True, materialize_grads=True)
    else:
        grads = torch.autograd.grad(
            graph.output, inputs, grad_outputs=grad_output, allow_unused=True, materialize_grads=True
        )
    n = len(graph.leaves)
    return tuple(grads[:n]), (grads[n] if len(grads) > n else None)


def on_device(x: Tensor, device: torch.device) -> Tensor:
    """``x`` on ``device`` (non-blocking); ``x`` itself, with no torch call, when it is there already (a
    torch call on the record path's thread hands the GIL to the training thread and waits to get it
    back)."""
    return x if x.device == device else x.to(device, non_blocking=True)


def predict_logits(runners: Sequence[StageRunner], versions: Sequence[StageVersion], x: Tensor) -> Tensor:
    """The model's output for ``x`` on the given versions, without autograd."""
    with torch.no_grad():
        for runner, version in zip(runners, versions, strict=True):
            device = version.params[0].device if version.params else x.device
            x = runner(version.params, version.buffers, on_device(x, device))
    return x


def unit_state(partition: Partition, stage_state: Sequence[dict[str, Tensor]]) -> dict[tuple[int, str], Tensor]:
    """Stage tensors keyed by the stage module's names (``"<local unit>.<name>"``, as :func:`build_stages`
    names them) re-keyed by (unit index in the model, name inside the unit): what the model's units hold
    once a master is copied into them."""
    stages = partition.stages
    out: dict[tuple[int, str], Tensor] = {}
    for j, tensors in enumerate(stage_state):
        for key, value in tensors.items():
            local, _, name = key.partition(".")
            out[(stages[j][int(local)], name)] = value
    return out
