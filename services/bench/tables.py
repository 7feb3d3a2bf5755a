"""Mean ± standard error over seeds, and Markdown tables that mark the best value in bold and the second
underlined, as the paper prints its tables; the paper's own numbers as a row beside ours.

The standard error is the sample standard deviation over seeds divided by √n (0 for one seed). Ranks
are taken on the values as printed (two decimals), so equal printed values share a mark.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DECIMALS = 2


@dataclass(frozen=True)
class Cell:
    """A mean and its standard error over ``n`` seeds (``n`` 0: no value)."""

    mean: float
    se: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Cell:
        values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        if not values:
            return cls(math.nan, math.nan, 0)
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
        return cls(statistics.fmean(values), se, len(values))

    @property
    def empty(self) -> bool:
        return self.n == 0

    def text(self, decimals: int = DECIMALS) -> str:
        if self.empty:
            return "—"
        return _fixed(self.mean, decimals) + _error(self.se, decimals)


def _error(se: float, decimals: int) -> str:
    """`` ± se``; nothing for a value without one (nan: a single published number)."""
    return "" if math.isnan(se) else f" ± {_fixed(se, decimals)}"


def _fixed(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return "0." + "0" * decimals if text.lstrip("-") == "0." + "0" * decimals else text  # no "-0.00"


def ranks(cells: Mapping[str, Cell], *, higher_is_better: bool = True, decimals: int = DECIMALS) -> dict[str, int]:
    """Rank 1 (best) and 2 (second) of the columns by their printed mean; ties share a rank."""
    printed = {k: round(c.mean, decimals) for k, c in cells.items() if not c.empty}
    distinct = sorted(set(printed.values()), reverse=higher_is_better)
    out: dict[str, int] = {}
    for rank, value in enumerate(distinct[:2], start=1):
        out.update({k: rank for k, v in printed.items() if v == value})
    return out


def marked(cell: Cell, rank: int | None, decimals: int = DECIMALS) -> str:
    """The cell's text with its mean bold (rank 1) or underlined (rank 2)."""
    if cell.empty:
        return "—"
    mean = _fixed(cell.mean, decimals)
    if rank == 1:
        mean = f"**{mean}**"
    elif rank == 2:
        mean = f"<u>{mean}</u>"
    return mean + _error(cell.se, decimals)


@dataclass(frozen=True)
class Row:
    """One table row: a label and a cell per column; ``ranked`` marks best and second."""

    label: str
    cells: Mapping[str, Cell]
    ranked: bool = True


def markdown(
    columns: Sequence[str],
    rows: Sequence[Row],
    *,
    first: str = "Setting",
    higher_is_better: bool = True,
    excluded_from_ranking: Sequence[str] = (),
    decimals: int = DECIMALS,
) -> str:
    """A Markdown table; ``excluded_from_ranking`` columns (the paper's grey Oracle, a zero baseline)
    are printed without marks and do not take a rank."""
    lines = [f"| {first} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for row in rows:
        rankable = {c: row.cells[c] for c in columns if c in row.cells and c not in excluded_from_ranking}
        order = ranks(rankable, higher_is_better=higher_is_better, decimals=decimals) if row.ranked else {}
        texts = [marked(row.cells.get(c, Cell(math.nan, math.nan, 0)), order.get(c), decimals) for c in columns]
        lines.append(f"| {row.label} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def paper_row(label: str, values: Mapping[str, Sequence[float]] | None) -> Row | None:
    """A row of the paper's [mean, s.e.] cells (``None`` when the paper has no such setting)."""
    if not values:
        return None
    return Row(label, {k: Cell(float(v[0]), float(v[1]), 1) for k, v in values.items()})


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan for fewer than 3 points."""
    if len(xs) != len(ys) or len(xs) < 3:
        return math.nan

    def rank(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out

    rx, ry = rank(xs), rank(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else math.nan
