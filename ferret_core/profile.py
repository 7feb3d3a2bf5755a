"""Layer profiles: the measured cost of each partitionable unit of a model.

A profile is what the planner consumes (Alg. 3 ``profile(θ)``): per unit t̂^f, t̂^b, |ŵ| and |â|.
It round-trips through the JSON format of DESIGN §4::

    {"model", "input_shape", "device", "dtype", "time_unit": "s",
     "layers": [{"name", "t_f", "t_b", "params", "activations"}]}

``saved`` (optional, elements of autograd's saved tensors per sample) is an extension used by the
``engine`` memory model; absent in older files. ``saved_input`` / ``saved_output`` (optional booleans)
say whether the unit's input and output storages are among those saved tensors, so the memory model
can count a storage two units share (one's output, the next one's input) once; without them it
counts each unit's saved tensors whole and every boundary again (an upper bound).

``batch_times`` (optional, per layer: ``[{"batch", "t_f", "t_b"}]``) holds t̂^f and t̂^b of one step of a
*mini-batch* of that many items, for the methods that train mini-batches (B-Skip, Camel, the replay
micro-batches of ER/MIR; written by ``ferret profile --batch-sizes 1,10,20``). The layer's own ``t_f`` and
``t_b`` are the times of one step of the profile's base batch (``meta.batch_size``, 1 by default). Every
layer lists the same batch sizes. :meth:`ModelProfile.layer_times` answers for any batch size between the
smallest and the largest profiled one: exactly where profiled, else by linear interpolation between the
two nearest profiled sizes (CPU and GPU step times are close to affine in the batch size between nearby
sizes); outside that range it raises :class:`ProfileError` naming the command that profiles the size.
Files without the field stay readable and answer only for their base batch size.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ferret_core.errors import ProfileError

DTYPE_BYTES: Mapping[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
}


def dtype_bytes(dtype: str) -> int:
    """Size in bytes of one element of ``dtype`` (e.g. ``"float32"`` → 4)."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ProfileError(f"unknown dtype {dtype!r}: expected one of {sorted(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class LayerProfile:
    """Measured cost of one partitionable unit (a layer or a residual block)."""

    name: str
    t_f: float  # forward time t̂^f, in the profile's time unit
    t_b: float  # backward time t̂^b
    params: int  # |ŵ|: parameter elements
    activations: int  # |â|: output activation elements per sample
    saved: int | None = None  # autograd saved-tensor elements per sample (engine memory model)
    saved_input: bool | None = None  # whether ``saved`` includes the unit's input storage
    saved_output: bool | None = None  # whether ``saved`` includes the unit's output storage
    batch_times: tuple[tuple[int, float, float], ...] = ()  # (batch size, t_f, t_b) of one mini-batch step

    def __post_init__(self) -> None:
        for key in ("t_f", "t_b"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ProfileError(f"layer {self.name!r}: {key} must be a finite number >= 0, got {value!r}")
        for key in ("params", "activations"):
            value = getattr(self, key)
            if not (isinstance(value, int) and value >= 0):
                raise ProfileError(f"layer {self.name!r}: {key} must be an integer >= 0, got {value!r}")
        if self.saved is not None and not (isinstance(self.saved, int) and self.saved >= 0):
            raise ProfileError(f"layer {self.name!r}: saved must be an integer >= 0, got {self.saved!r}")
        for key in ("saved_input", "saved_output"):
            flag = getattr(self, key)
            if flag is not None and not isinstance(flag, bool):
                raise ProfileError(f"layer {self.name!r}: {key} must be true, false or absent, got {flag!r}")
        sizes = [row[0] for row in self.batch_times]
        if sizes != sorted(set(sizes)):
            raise ProfileError(f"layer {self.name!r}: batch_times must list distinct batch sizes in increasing order")
        for batch, t_f, t_b in self.batch_times:
            if not (isinstance(batch, int) and batch >= 1):
                raise ProfileError(f"layer {self.name!r}: batch_times batch must be an integer >= 1, got {batch!r}")
            for key, value in (("t_f", t_f), ("t_b", t_b)):
                if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                    raise ProfileError(
                        f"layer {self.name!r}: batch_times[{batch}].{key} must be a finite number >= 0, got {value!r}"
                    )

    @property
    def t_fb(self) -> float:
        """t̂^f + t̂^b: the unit's share of a stage time (Alg. 3, DESIGN §3.5)."""
        return self.t_f + self.t_b


@dataclass(frozen=True)
class ModelProfile:
    """A whole model's profile: its units in execution order."""

    model: str
    input_shape: tuple[int, ...]
    layers: tuple[LayerProfile, ...]
    device: str = "cpu"
    dtype: str = "float32"
    time_unit: str = "s"
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ProfileError(f"profile of {self.model!r} has no layers; a model needs at least one unit")
        if self.time_unit != "s":
            raise ProfileError(f"time_unit must be 's' (seconds), got {self.time_unit!r}")
        dtype_bytes(self.dtype)
        sizes = {tuple(row[0] for row in layer.batch_times) for layer in self.layers}
        if len(sizes) > 1:
            raise ProfileError(
                f"profile of {self.model!r}: every layer must list the same batch_times sizes, got {sorted(sizes)}"
            )
        base = self.base_batch
        if not (isinstance(base, int) and base >= 1):
            raise ProfileError(f"profile of {self.model!r}: meta.batch_size must be an integer >= 1, got {base!r}")

    @property
    def num_units(self) -> int:
        return len(self.layers)

    @property
    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def input_elements(self) -> int:
        return math.prod(self.input_shape)

    @property
    def max_forward_time(self) -> float:
        """max_i t̂_i^f: the paper's arrival interval t^d (appendix, Hyper-parameters)."""
        return max(layer.t_f for layer in self.layers)

    @property
    def sequential_time(self) -> float:
        """Σ_i (t̂_i^f + t̂_i^b): one sequential forward and backward of the whole model."""
        return sum(layer.t_fb for layer in self.layers)

    def check_input(self, input_shape: Sequence[int], *, source: str = "the profile") -> None:
        """Refuse to plan a model from a profile taken at another input shape (its times and activation
        sizes would price a run the model never does)."""
        want, have = tuple(input_shape), tuple(self.input_shape)
        flat_alike = (len(want) == 1 or len(have) == 1) and math.prod(want) == math.prod(have)  # an MLP flattens
        if want != have and not flat_alike:
            raise ProfileError(
                f"{source} was taken for input shape {list(self.input_shape)} but the model takes "
                f"{list(input_shape)}; profile the model at its input size (ferret profile --input-size …) "
                "or pass the profile made for it"
            )
    @property
    def base_batch(self) -> int:
        """Items per step of the layers' own ``t_f``/``t_b`` (``meta.batch_size``; 1 when absent)."""
        value = self.meta.get("batch_size", 1)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes whose step times were measured: the base batch and ``batch_times``'s sizes."""
        return tuple(sorted({self.base_batch, *(row[0] for row in self.layers[0].batch_times)}))

    def layer_times(self, batch: int) -> tuple[tuple[float, float], ...]:
        """(t̂^f, t̂^b) of one step of ``batch`` items, per layer: measured where profiled, else linearly
        interpolated between the two nearest profiled batch sizes (see the module docstring)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ProfileError(f"batch size must be an integer >= 1, got {batch!r}")
        sizes = self.batch_sizes
        if not sizes[0] <= batch <= sizes[-1]:
            wanted = ",".join(str(b) for b in sorted({*sizes, batch}))
            raise ProfileError(
                f"profile of {self.model!r} has step times for batch sizes {list(sizes)}, not for {batch}; "
                f"re-profile with `ferret profile --model {self.model} --batch-sizes {wanted} --out FILE`"
            )
        return tuple(_interpolated(_layer_table(layer, self.base_batch), batch) for layer in self.layers)

    def at_batch(self, batch: int) -> ModelProfile:
        """This profile with every layer's ``t_f``/``t_b`` replaced by one step of ``batch`` items and
        ``batch`` as its base batch (sizes stay per item): what the planner plans with when the pipeline's
        unit of work is a micro-batch. Its ``max_forward_time`` is the batch's, not the stream's t^d."""
        if batch == self.base_batch:
            return self
        times = self.layer_times(batch)
        base = self.base_batch
        layers = tuple(
            dataclasses.replace(
                layer, t_f=t_f, t_b=t_b,
                batch_times=tuple(row for row in _layer_table(layer, base) if row[0] != batch),
            )
            for layer, (t_f, t_b) in zip(self.layers, times, strict=True)
        )
        meta = {**self.meta, "batch_size": batch}
        return ModelProfile(self.model, self.input_shape, layers, self.device, self.dtype, self.time_unit, meta)

    def scaled(self, factor: float) -> ModelProfile:
        """This profile with every layer's t̂^f and t̂^b (and its ``batch_times``) multiplied by ``factor``:
        the profile read in the time of a machine that takes ``factor`` × the profiled time per item (the
        live trainer's measured ÷ planned service time, ``docs/planner.md`` reading 11; ours, not in the
        paper). Sizes are unchanged; ``meta.time_scale`` accumulates the factor."""
        valid = isinstance(factor, (int, float)) and not isinstance(factor, bool)
        if not valid or not (math.isfinite(factor) and factor > 0):
            raise ProfileError(f"a profile's time scale must be a finite number > 0, got {factor!r}")
        if factor == 1.0:
            return self
        layers = tuple(
            dataclasses.replace(
                layer,
                t_f=layer.t_f * factor,
                t_b=layer.t_b * factor,
                batch_times=tuple((b, t_f * factor, t_b * factor) for b, t_f, t_b in layer.batch_times),
            )
            for layer in self.layers
        )
        meta = {**self.meta, "time_scale": float(self.meta.get("time_scale", 1.0)) * factor}
        return ModelProfile(self.model, self.input_shape, layers, self.device, self.dtype, self.time_unit, meta)

    def to_dict(self) -> dict[str, Any]:
        layers = []
        for layer in self.layers:
            row: dict[str, Any] = {
                "name": layer.name,
                "t_f": layer.t_f,
                "t_b": layer.t_b,
                "params": layer.params,
                "activations": layer.activations,
            }
            if layer.saved is not None:
                row["saved"] = layer.saved
            for key in ("saved_input", "saved_output"):
                if getattr(layer, key) is not None:
                    row[key] = getattr(layer, key)
            if layer.batch_times:
                row["batch_times"] = [{"batch": b, "t_f": t_f, "t_b": t_b} for b, t_f, t_b in layer.batch_times]
            layers.append(row)
        out: dict[str, Any] = {
            "model": self.model,
            "input_shape": list(self.input_shape),
            "device": self.device,
            "dtype": self.dtype,
            "time_unit": self.time_unit,
            "layers": layers,
        }
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>") -> ModelProfile:
        missing = [key for key in ("model", "input_shape", "layers") if key not in data]
        if missing:
            raise ProfileError(
                f"{source}: profile is missing keys {missing}; expected the JSON of DESIGN §4 "
                "(write one with `ferret profile --model NAME --out FILE`)"
            )
        layers_raw = data["layers"]
        if not isinstance(layers_raw, Sequence) or isinstance(layers_raw, (str, bytes)):
            raise ProfileError(f"{source}: 'layers' must be a list, got {type(layers_raw).__name__}")
        layers: list[LayerProfile] = []
        for index, row in enumerate(layers_raw):
            if not isinstance(row, Mapping):
                raise ProfileError(f"{source}: layers[{index}] must be an object, got {row!r}")
            absent = [k for k in ("t_f", "t_b", "params", "activations") if k not in row]
            if absent:
                raise ProfileError(f"{source}: layers[{index}] is missing {absent}")
            saved = row.get("saved")
            layers.append(
                LayerProfile(
                    name=str(row.get("name", f"unit{index}")),
                    t_f=float(row["t_f"]),
                    t_b=float(row["t_b"]),
                    params=_as_int(row["params"], f"{source}: layers[{index}].params"),
                    activations=_as_int(row["activations"], f"{source}: layers[{index}].activations"),
                    saved=None if saved is None else _as_int(saved, f"{source}: layers[{index}].saved"),
                    saved_input=row.get("saved_input"),
                    saved_output=row.get("saved_output"),
                    batch_times=_batch_times(row.get("batch_times", ()), f"{source}: layers[{index}].batch_times"),
                )
            )
        return cls(
            model=str(data["model"]),
            input_shape=tuple(_as_int(v, f"{source}: input_shape") for v in data["input_shape"]),
            layers=tuple(layers),
            device=str(data.get("device", "cpu")),
            dtype=str(data.get("dtype", "float32")),
            time_unit=str(data.get("time_unit", "s")),
            meta=dict(data.get("meta", {})),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelProfile:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ProfileError(f"profile file {str(path)!r} does not exist; create it with `ferret profile`") from None
        except json.JSONDecodeError as exc:
            raise ProfileError(f"profile file {str(path)!r} is not valid JSON: {exc}") from None
        if not isinstance(data, Mapping):
            raise ProfileError(f"profile file {str(path)!r} must hold a JSON object")
        return cls.from_dict(data, source=str(path))


def _batch_times(raw: Any, where: str) -> tuple[tuple[int, float, float], ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise ProfileError(f"{where}: expected a list of {{batch, t_f, t_b}} objects, got {raw!r}")
    out = []
    for row in raw:
        if not isinstance(row, Mapping) or not {"batch", "t_f", "t_b"} <= set(row):
            raise ProfileError(f"{where}: expected objects with keys batch, t_f, t_b, got {row!r}")
        out.append((_as_int(row["batch"], f"{where}.batch"), float(row["t_f"]), float(row["t_b"])))
    return tuple(sorted(out))


def _layer_table(layer: LayerProfile, base: int) -> list[tuple[int, float, float]]:
    table = {b: (t_f, t_b) for b, t_f, t_b in layer.batch_times}
    table[base] = (layer.t_f, layer.t_b)
    return sorted((b, t_f, t_b) for b, (t_f, t_b) in table.items())


def _interpolated(table: list[tuple[int, float, float]], batch: int) -> tuple[float, float]:
    """(t_f, t_b) at ``batch`` from a sorted (batch, t_f, t_b) table that brackets it."""
    for (b0, f0, g0), (b1, f1, g1) in itertools.pairwise(table):
        if b0 <= batch <= b1:
            w = (batch - b0) / (b1 - b0)
            return f0 + w * (f1 - f0), g0 + w * (g1 - g0)
    _, t_f, t_b = table[0]
    return t_f, t_b  # a single profiled size equal to ``batch``


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ProfileError(f"{where}: expected an integer, got {value!r}")
    return int(value)
