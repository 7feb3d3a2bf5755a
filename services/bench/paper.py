"""The paper's numbers printed beside ours: ``benchmarks/paper/paper_numbers.json``, extracted from
``../shared/paper/ferret.tex`` by ``benchmarks/paper/extract_paper_numbers.py``; each cell is
[mean, standard error] and each table keeps its LaTeX label."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

PAPER_NUMBERS = Path(__file__).resolve().parents[2] / "benchmarks" / "paper" / "paper_numbers.json"


@lru_cache(maxsize=1)
def paper_tables() -> dict[str, Any]:
    tables: dict[str, Any] = json.loads(PAPER_NUMBERS.read_text())["tables"]
    return tables


def paper_cells(table: str, setting: str) -> dict[str, list[float]] | None:
    """The paper's cells of ``setting`` (our dataset/model id) in ``table``, or ``None``."""
    rows: dict[str, Any] = paper_tables()[table]["rows"]
    found = rows.get(setting)
    return None if found is None else dict(found)


def paper_memory_ratios(setting: str) -> dict[str, float] | None:
    """The paper's memory ratio to 1-Skip per method, backed out of its agm and oacc tables (DESIGN §3.2):
    agm = Δoacc / ln 10 − log10(M_A / M_B) ⇒ M_A / M_B = 10^(Δoacc / ln 10 − agm)."""
    agm, oacc = paper_cells("tab:overall-table", setting), paper_cells("tab:add-online-acc", setting)
    if agm is None or oacc is None:
        return None
    base = oacc["1-skip"][0]
    return {m: 10 ** ((oacc[m][0] - base) / math.log(10.0) - agm[m][0]) for m in agm if m in oacc}
