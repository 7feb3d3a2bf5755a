"""Errors of export and serving; each is a :class:`~ferret_core.errors.FerretError` and the matching
built-in, so the CLI prints one line and exits 1."""

from __future__ import annotations

from ferret_core.errors import FerretError


class ExportError(FerretError, ValueError):
    """An export directory cannot be written or read back (missing file, checksum, wrong tensors)."""


class ModelStreamError(FerretError, RuntimeError):
    """The model stream holds something a follower cannot use (a corrupt or incomplete update)."""


class NoModelYet(FerretError, LookupError):
    """Serving has no model: the trainer has not published one yet (gRPC UNAVAILABLE)."""


class InvalidInput(FerretError, ValueError):
    """A Predict request's tensor does not fit the served model's input contract (INVALID_ARGUMENT)."""
