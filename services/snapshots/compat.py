"""Which snapshots a trainer may restore: the plan parses and the model matches the configured one.

A :class:`ModelFingerprint` is the configured model's name plus the names, shapes and dtypes of its
tensors (those under ``prefix``, ``model.`` by default: optimizer and compensator state may come and go).
:func:`check_plan` and :meth:`ModelFingerprint.mismatch` read only the manifest, so an incompatible
snapshot is skipped before its chunks are fetched::

    fingerprint = ModelFingerprint.of("mnistnet", learner.state_tensors())
    choice = store.newest_compatible(fingerprint)   # payload None: start fresh; choice.skipped says why
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ferret_core.errors import FerretError
from ferret_core.plan import Plan
from services.snapshots.errors import SnapshotCorruptError


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(int(s) for s in tensor.shape), str(tensor.dtype).removeprefix("torch."))

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> TensorSpec:
        """From a manifest's ``{"shape": [...], "dtype": "float32"}`` (:func:`codec.tensor_summary`)."""
        return cls(tuple(int(s) for s in summary["shape"]), str(summary["dtype"]))

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class ModelFingerprint:
    """The configured model as a snapshot must match it: ``model`` (the plan's model name) and the
    spec of every tensor whose name starts with ``prefix``."""

    model: str
    tensors: Mapping[str, TensorSpec]
    prefix: str = "model."

    @classmethod
    def of(cls, model: str, tensors: Mapping[str, torch.Tensor], prefix: str = "model.") -> ModelFingerprint:
        """The fingerprint of a learner's ``state_tensors()`` (only the names under ``prefix`` count)."""
        specs = {name: TensorSpec.of(t) for name, t in tensors.items() if name.startswith(prefix)}
        return cls(model=model, tensors=specs, prefix=prefix)

    def mismatch(self, model: str, summary: Mapping[str, Mapping[str, Any]]) -> str | None:
        """Why a snapshot of ``model`` with tensors ``summary`` does not fit this model (None: it fits)."""
        if model != self.model:
            return f"it is a snapshot of model {model!r}, the trainer is configured for {self.model!r}"
        try:
            theirs = {n: TensorSpec.from_summary(s) for n, s in summary.items() if n.startswith(self.prefix)}
        except (KeyError, TypeError, ValueError) as exc:
            return f"its tensor list is malformed ({exc})"
        missing = sorted(set(self.tensors) - set(theirs))
        extra = sorted(set(theirs) - set(self.tensors))
        differ = [n for n in sorted(set(self.tensors) & set(theirs)) if theirs[n] != self.tensors[n]]
        problems = []
        if differ:
            shown = ", ".join(f"{n} is {theirs[n]}, expected {self.tensors[n]}" for n in differ[:3])
            problems.append(f"{len(differ)} tensors differ ({shown})")
        if missing:
            problems.append(f"{len(missing)} tensors missing ({', '.join(missing[:3])})")
        if extra:
            problems.append(f"{len(extra)} unexpected tensors ({', '.join(extra[:3])})")
        return "; ".join(problems) or None


def check_plan(plan: Mapping[str, Any], who: str) -> Plan | None:
    """The manifest's plan as a ``Plan`` (None for a snapshot saved without one), or
    :class:`SnapshotCorruptError` when it does not parse."""
    if not plan:
        return None
    try:
        return Plan.from_dict(plan)
    except (FerretError, KeyError, TypeError, ValueError, AttributeError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SnapshotCorruptError(f"{who}: the plan is malformed ({type(exc).__name__}: {reason})") from None
