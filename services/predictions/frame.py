"""Predictions as a pandas DataFrame, for notebooks. pandas is optional (the ``pandas`` extra): without it
:func:`to_dataframe` raises :class:`MissingExtra` naming the extra to install."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from ferret_core.errors import FerretError
from services.predictions.records import PredictionRecord

COLUMNS = tuple(f.name for f in fields(PredictionRecord))


class MissingExtra(FerretError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def to_dataframe(records: Iterable[PredictionRecord]) -> Any:
    """One row per record, a column per :class:`PredictionRecord` field (``top_k`` holds tuples of
    ``(class_index, probability)``), plus ``predicted_time`` (UTC) from ``predicted_time_ms``. ``label``
    and ``correct`` are nullable (``Int64``, ``boolean``): missing where the label was not known."""
    try:
        import pandas as pd
    except ImportError:
        raise MissingExtra(
            "to_dataframe needs pandas, which Ferret does not install by default: "
            "pip install 'ferret-ocl[pandas]' (or pip install pandas)"
        ) from None
    rows = []
    for record in records:
        row = {name: getattr(record, name) for name in COLUMNS}
        row["top_k"] = tuple((p.class_index, p.probability) for p in record.top_k)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["label"] = frame["label"].astype("Int64")
    frame["correct"] = frame["correct"].astype("boolean")
    frame["predicted_time"] = pd.to_datetime(frame["predicted_time_ms"], unit="ms", utc=True)
    return frame
