"""The CSV of raw per-run results: one row per finished run, appended as runs finish (so an interrupted
bench loses at most the runs in flight); ``--resume`` reads the keys already there and skips them."""

from __future__ import annotations

import csv
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ferret_core.errors import ConfigError

COLUMNS: tuple[str, ...] = (
    "key",
    "experiment",
    "setting",
    "dataset",
    "model",
    "column",
    "method",
    "budget",
    "budget_bytes",
    "algorithm",
    "compensator",
    "seed",
    "items",
    "oacc",
    "tacc",
    "peak_bytes",
    "planned_bytes",
    "adaptation_rate",
    "num_stages",
    "num_workers",
    "wall_seconds",
    "relative_correction",  # per stage, ';'-separated: the compensator's mean ‖c‖/‖g‖ over stale gradients
    "staleness_histogram",  # per stage, ';'-separated, each 'τ:count' joined by spaces
)
# the columns of folders written before the per-stage compensator columns (read and resumed as they are)
LEGACY_COLUMNS: tuple[str, ...] = COLUMNS[:-2]
FLOATS = frozenset({"oacc", "tacc", "adaptation_rate", "wall_seconds"})
INTS = frozenset({"budget_bytes", "seed", "items", "peak_bytes", "planned_bytes", "num_stages", "num_workers"})


class RunsCsv:
    """``runs.csv`` of one bench output folder; thread-safe appends."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.columns = COLUMNS
        if path.exists() and not resume:
            raise ConfigError(
                f"{path} exists: pass --resume to continue it (runs already there are skipped) or choose "
                "another --out; nothing was overwritten"
            )
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="") as handle:
                csv.writer(handle).writerow(COLUMNS)
        else:
            with path.open(newline="") as handle:
                header = next(csv.reader(handle), None)
            if header not in (list(COLUMNS), list(LEGACY_COLUMNS)):
                raise ConfigError(
                    f"{path}: expected the bench's columns {','.join(COLUMNS)}, got {header}; choose another --out"
                )
            self.columns = tuple(header)

    def keys(self) -> set[str]:
        return {row["key"] for row in self.rows()}

    def rows(self) -> list[dict[str, Any]]:
        with self.path.open(newline="") as handle:
            return [_typed(row) for row in csv.DictReader(handle)]

    def append(self, row: Mapping[str, Any]) -> None:
        missing = set(self.columns) - set(row)
        if missing:
            raise ConfigError(f"run row lacks {sorted(missing)}")
        with self._lock, self.path.open("a", newline="") as handle:
            csv.writer(handle).writerow(["" if row[c] is None else row[c] for c in self.columns])


def _typed(row: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, text in row.items():
        if text == "" or text is None:
            out[name] = None
        elif name in FLOATS:
            out[name] = float(text)
        elif name in INTS:
            out[name] = int(text)
        else:
            out[name] = text
    return out
