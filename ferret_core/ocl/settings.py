"""Hyper-parameters of the OCL algorithms, and what each follows."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ferret_core.errors import ConfigError


@dataclass(frozen=True)
class AlgorithmSettings:
    """Defaults: ``buffer_size`` 5000 (the paper's replay buffers, appendix Hyper-parameters);
    ``replay_batch`` ``None``: as many replayed samples as the step admits (ER's and MIR's papers replay a
    memory batch as large as the incoming one, 10 and 10: here 1 for a single item, N for a B-Skip
    mini-batch); ``mir_candidates`` ``None``: five times the replayed samples (MIR's 50 candidates for 10);
    LwF α = 1, T = 2 (Avalanche; Li & Hoiem's T = 2) and a teacher refreshed
    every ``lwf_every`` = 1000 trained items; MAS λ = 1, importance decay α = 0.5 (Avalanche) refreshed
    every ``mas_every`` = 100 trained items; ``seed`` for the buffers' draws."""

    buffer_size: int = 5000
    replay_batch: int | None = None
    mir_candidates: int | None = None
    lwf_alpha: float = 1.0
    lwf_temperature: float = 2.0
    lwf_every: int = 1000
    mas_lambda: float = 1.0
    mas_alpha: float = 0.5
    mas_every: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("buffer_size", "replay_batch", "mir_candidates", "lwf_every", "mas_every"):
            value = getattr(self, key)
            if value is None and key in ("replay_batch", "mir_candidates"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key} must be an integer >= 1, got {value!r}")
        candidates, replayed = self.mir_candidates, self.replay_batch
        if candidates is not None and replayed is not None and candidates < replayed:
            raise ConfigError(
                f"mir_candidates ({self.mir_candidates}) must be at least replay_batch ({self.replay_batch})"
            )
        for key in ("lwf_alpha", "lwf_temperature", "mas_lambda"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0) or (key == "lwf_temperature" and value == 0):
                raise ConfigError(f"{key} must be a finite number > 0 (>= 0 for weights), got {value!r}")
        if not 0 <= self.mas_alpha < 1:
            raise ConfigError(f"mas_alpha must lie in [0, 1), got {self.mas_alpha}")

    def replayed(self, new: int) -> int:
        """Samples replayed with ``new`` admitted ones."""
        return new if self.replay_batch is None else self.replay_batch

    def candidates(self, new: int) -> int:
        """MIR's candidates scored for ``new`` admitted samples."""
        return 5 * self.replayed(new) if self.mir_candidates is None else max(self.mir_candidates, self.replayed(new))
