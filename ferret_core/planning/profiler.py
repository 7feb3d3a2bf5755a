"""Layer profiler: Alg. 3's ``profile(θ)`` — per unit t̂^f, t̂^b, |ŵ| and |â| (plus autograd's saved bytes).

Each unit is timed alone, on the activations the previous unit really produces (random input of the
model's shape for the first unit, seeded by a local generator):

- t̂^f: the forward ``unit(x)`` with autograd recording (a training forward), input requiring grad
  except for the first unit;
- t̂^b: ``torch.autograd.grad(out, [x] + params, grad_outputs=g)`` for that unit's graph alone (the first
  unit's input needs no gradient, as in the engine's first stage); 0 when nothing requires grad.

Both are the MEDIAN of ``repeats`` timings after ``warmup`` untimed forward+backward runs, for a batch of
``batch_size`` items (the stream's batch; 1 by default), unit after unit, as a dedicated executor per
stage would run them (DESIGN §2). (Rounds over all units were tried: the first unit of every round then
paid page faults for the heap the allocator had just trimmed, 2–12 ms on ResNet-18's stem instead of
0.1–3 ms.) The clock (:func:`resolve_clock`): on a CPU with one torch thread, the thread's CPU time,
which other processes on a shared machine cannot inflate by preempting it; with several threads, wall
time; on CUDA, CUDA events on the current stream after a synchronisation. Garbage is collected once,
then the collector is paused while the units are profiled.

``batch_sizes`` (e.g. ``(1, 10, 20)``) times the units again for each further mini-batch size, the same
way (a pass over the units per size, on that size's own activations), and records them as the layers'
``batch_times`` (:mod:`ferret_core.profile`): the step times of the mini-batch methods (B-Skip, Camel,
replay micro-batches).

Sizes are per sample: ``params`` = |ŵ| (parameter elements of the unit), ``activations`` = |â| (output
elements), ``saved`` = bytes of the distinct storages autograd saves for the backward (counted by a
``saved_tensors_hooks`` pack hook, deduplicated by ``untyped_storage().data_ptr()``, parameters and
buffers excluded), expressed in elements of the profile's dtype (so ``saved × dtype_bytes`` is bytes;
int64 max-pool indices count double). It includes the unit's input when autograd keeps it;
``saved_input`` / ``saved_output`` say whether the unit's input / output storage is among the saved ones
(so the memory model counts a storage two neighbouring units share once).

The model is never mutated: the profiler works on a ``copy.deepcopy`` of the units (in train mode, on
the requested device and dtype), so the caller's parameters, buffers, ``.grad`` and train/eval mode
stay as they were.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ferret_core.errors import ConfigError, ProfileError
from ferret_core.profile import LayerProfile, ModelProfile
from ferret_core.zoo.base import ZooModel

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_INPUT_SEED = 0
CLOCKS: tuple[str, ...] = ("auto", "wall", "cpu")

ProgressCallback = Callable[[int, int], None]


def profile_model(
    model: ZooModel,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    warmup: int = 3,
    repeats: int = 10,
    batch_size: int = 1,
    batch_sizes: Sequence[int] = (),
    clock: str = "auto",
    progress: ProgressCallback | None = None,
) -> ModelProfile:
    """Time and size every unit of ``model`` (see the module docstring).

    ``batch_sizes``: further mini-batch sizes to time (``batch_size`` itself may be among them).
    ``clock`` picks the timer (:func:`resolve_clock`). ``progress(done, total)`` is called after each
    unit of each batch size (``total`` = units × sizes).
    """
    dev = resolve_device(device)
    timer = _Timer(dev, resolve_clock(clock, dev))
    torch_dtype = _resolve_dtype(dtype)
    _check_count("warmup", warmup, minimum=0)
    _check_count("repeats", repeats, minimum=1)
    _check_count("batch_size", batch_size, minimum=1)
    for size in batch_sizes:
        _check_count("batch_sizes entry", size, minimum=1)
    extra = sorted(set(batch_sizes) - {batch_size})
    units = tuple(copy.deepcopy(model.units))
    for unit in units:
        unit.to(device=dev, dtype=torch_dtype)
        unit.train()
    total = len(units) * (1 + len(extra))
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    with _on_device(dev), _gc_paused():
        layers = _profile_units(model, units, batch_size, dtype, dev, timer, warmup, repeats, step)
        timings = {b: _profile_units(model, units, b, dtype, dev, timer, warmup, repeats, step) for b in extra}
    if extra:
        layers = [
            dataclasses.replace(layer, batch_times=tuple((b, timings[b][i].t_f, timings[b][i].t_b) for b in extra))
            for i, layer in enumerate(layers)
        ]
    meta = _meta(model, dev, timer.clock, warmup=warmup, repeats=repeats, batch_size=batch_size)
    if extra:
        meta["batch_sizes"] = sorted({batch_size, *extra})
    return ModelProfile(
        model=model.name,
        input_shape=model.input_shape,
        layers=tuple(layers),
        device=dev.type,
        dtype=dtype,
        meta=meta,
    )


def _profile_units(
    model: ZooModel,
    units: Sequence[nn.Module],
    batch_size: int,
    dtype: str,
    dev: torch.device,
    timer: _Timer,
    warmup: int,
    repeats: int,
    step: Callable[[], None],
) -> list[LayerProfile]:
    """One pass over the units at ``batch_size`` items (inputs seeded, so every size starts alike)."""
    generator = torch.Generator().manual_seed(_INPUT_SEED)
    x = torch.randn((batch_size, *model.input_shape), generator=generator).to(dev, _resolve_dtype(dtype))
    layers: list[LayerProfile] = []
    for index, (name, unit) in enumerate(zip(model.unit_names, units, strict=True)):
        with _blame(model, index, x, dtype, dev):
            bench = _UnitBench(unit, x, name, first=index == 0, generator=generator)
            for round_index in range(warmup + repeats):
                bench.run(timer if round_index >= warmup else None)
            layers.append(bench.result(batch_size))
        x = bench.output
        step()
    return layers


def resolve_device(device: str) -> torch.device:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as a device that exists here, else :class:`ConfigError`."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"invalid device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r} requested but CUDA is not available here (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'no'}); use device 'cpu' or run on a GPU machine"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type != "cpu":
        raise ConfigError(f"unsupported device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
    return dev


class _UnitBench:
    """One unit with its fixed input, gradient targets and output gradient, and its timings."""

    def __init__(self, unit: nn.Module, x: torch.Tensor, name: str, *, first: bool, generator: torch.Generator) -> None:
        self.unit = unit
        self.name = name
        self.x_in = x.detach().requires_grad_(not first)
        params = [p for p in unit.parameters() if p.requires_grad]
        self.wrt: list[torch.Tensor] = [*([] if first else [self.x_in]), *params]
        out = self.forward()
        self.grad_out = torch.randn(out.shape, generator=generator).to(out.device, out.dtype)
        self.trainable = out.requires_grad and bool(self.wrt)
        self.backward(out)  # the first call pays lazy initialisation: never timed
        self.output = out.detach()
        self.t_f: list[float] = []
        self.t_b: list[float] = []

    def forward(self) -> torch.Tensor:
        out = self.unit(self.x_in)
        if not isinstance(out, torch.Tensor):
            raise ProfileError(f"unit {self.name!r} returned {type(out).__name__}, expected a tensor")
        return out

    def backward(self, out: torch.Tensor) -> None:
        if self.trainable:
            torch.autograd.grad(out, self.wrt, grad_outputs=self.grad_out)

    def run(self, timer: _Timer | None) -> None:
        """One forward and backward; timed (and recorded) when ``timer`` is given."""
        if timer is None:
            self.backward(self.forward())
            return
        out, seconds = timer.time(self.forward)
        self.t_f.append(seconds)
        _, seconds = timer.time(functools.partial(self.backward, out))
        self.t_b.append(seconds)

    def result(self, batch_size: int) -> LayerProfile:
        element = self.output.element_size()
        saved_bytes, saved_input, saved_output = _saved_bytes(self.unit, self.forward, self.x_in)
        return LayerProfile(
            name=self.name,
            t_f=statistics.median(self.t_f),
            t_b=statistics.median(self.t_b) if self.trainable else 0.0,
            params=sum(p.numel() for p in self.unit.parameters()),
            activations=self.output.numel() // batch_size,
            saved=-(-saved_bytes // (element * batch_size)),
            saved_input=saved_input,
            saved_output=saved_output,
        )


@contextmanager
def _blame(model: ZooModel, index: int, x: torch.Tensor, dtype: str, dev: torch.device) -> Iterator[None]:
    """Re-raise a unit's runtime failure as a :class:`ProfileError` naming the unit."""
    try:
        yield
    except RuntimeError as exc:
        raise ProfileError(
            f"{model.name}: unit {index} ({model.unit_names[index]}) failed on input {tuple(x.shape)} "
            f"({dtype} on {dev}): {exc}"
        ) from exc


def _saved_bytes(
    unit: nn.Module, forward: Callable[[], torch.Tensor], x_in: torch.Tensor
) -> tuple[int, bool, bool]:
    """Bytes of the distinct storages autograd saves during one forward, excluding parameters/buffers,
    and whether the input's and the output's storages are among them."""
    state = {_storage_key(t)[0] for t in (*unit.parameters(), *unit.buffers())}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key, nbytes = _storage_key(tensor)
        if key not in state:
            seen[key] = max(seen.get(key, 0), nbytes)
        return tensor

    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = forward()
    output_key = _storage_key(out)[0]
    del out
    return sum(seen.values()), _storage_key(x_in)[0] in seen, output_key in seen


def _storage_key(tensor: torch.Tensor) -> tuple[int, int]:
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # tensors without a plain storage
        return id(tensor), tensor.numel() * tensor.element_size()


class _Timer:
    """Duration of a call on one of :data:`CLOCKS` (see :func:`resolve_clock`)."""

    def __init__(self, device: torch.device, clock: str) -> None:
        self.device = device
        self.clock = clock

    def time(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        if self.clock == "cuda-event":
            torch.cuda.synchronize(self.device)
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            result = fn()
            end.record()
            end.synchronize()
            return result, start.elapsed_time(end) / 1e3
        read = time.thread_time if self.clock == "cpu" else time.perf_counter
        begin = read()
        result = fn()
        return result, read() - begin


def resolve_clock(clock: str, device: torch.device) -> str:
    """The clock that times ``device`` for ``clock`` in :data:`CLOCKS`.

    ``auto``: CUDA events on a GPU; on a CPU with one torch thread, the calling thread's CPU time
    (``time.thread_time``: every op and the CPU backward run on that thread, and time the thread was
    preempted by other processes is not counted, which on a shared machine inflated wall-clock medians
    up to 5×); with several torch threads, wall time (``perf_counter``), since thread time would miss
    the intra-op workers. ``wall`` forces wall time, ``cpu`` the thread CPU time (CPU, one thread only).
    """
    if clock not in CLOCKS:
        raise ConfigError(f"unknown clock {clock!r}: expected one of {', '.join(CLOCKS)}")
    if device.type == "cuda":
        if clock == "cpu":
            raise ConfigError("clock 'cpu' times host threads; on CUDA use 'auto' (CUDA events) or 'wall'")
        return "cuda-event" if clock == "auto" else "wall"
    precise = time.get_clock_info("thread_time").resolution <= 1e-6
    single = torch.get_num_threads() == 1
    if clock == "cpu" and not (single and precise):
        raise ConfigError(
            "clock 'cpu' needs one torch thread (torch.set_num_threads(1), `--threads 1`) and a "
            f"precise thread clock; got {torch.get_num_threads()} threads: use 'wall' or 'auto'"
        )
    if clock == "auto":
        return "cpu" if single and precise else "wall"
    return clock


@contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def _on_device(dev: torch.device) -> Iterator[None]:
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            yield
    else:
        yield


def _resolve_dtype(dtype: str) -> torch.dtype:
    try:
        return _TORCH_DTYPES[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}: expected one of {sorted(_TORCH_DTYPES)}") from None


def _check_count(name: str, value: int, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _meta(
    model: ZooModel, dev: torch.device, clock: str, *, warmup: int, repeats: int, batch_size: int
) -> dict[str, Any]:
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name()
    return {
        "profiler": "ferret_core.planning.profiler",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "warmup": warmup,
        "repeats": repeats,
        "statistic": "median",
        "clock": clock,
        "batch_size": batch_size,
        "times_are": "per batch of batch_size items; sizes per sample",
        "saved_unit": "elements of the profile dtype (bytes / dtype size)",
        "num_classes": model.num_classes,
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1min": _load_average(),  # other work on the machine inflates CPU timings
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None
