"""The staleness cost the planner's accuracy objective needs: read from ``--staleness-cost FILE``, or
calibrated on the stream's head (``ferret simulate --objective accuracy``) and cached.

The calibration (:mod:`ferret_core.engine.staleness_calibration`) runs the engine on the first
``--calibration-items`` items of the very stream the run will see (the head of ``iter_stream`` with the
run's options), with the run's learning rate, model and OCL-free SGD, for three model initialisations
(seeds 1000–1002, none of the benchmarks' seeds). Its result is a value the planner takes
(``PlannerSettings.staleness_cost``); it is kept as JSON under ``CACHE/staleness/KEY.json``, KEY hashing
everything it depends on — the model, the learning rate, the calibration settings and the head's content
(labels and pixel sums) — so runs on the same stream reuse it whatever their seed, and the file can be
passed to ``ferret plan --objective accuracy --staleness-cost FILE``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import nn

from ferret_core.data import Dataset, StreamItem, iter_stream
from ferret_core.engine.staleness_calibration import CalibrationSettings, calibrate_staleness
from ferret_core.errors import ConfigError
from ferret_core.planning.staleness_cost import StalenessCost

DEFAULT_CALIBRATION_ITEMS = 250
CALIBRATION_VERSION = 1  # part of the cache key: bump when the calibration's procedure changes


def load_cost(path: Path, what: str = "--staleness-cost") -> StalenessCost:
    """A staleness cost document (the JSON this module writes); ``what`` names the option that gave it."""
    return StalenessCost.load(path, what)


def _head_digest(items: Sequence[StreamItem]) -> str:
    digest = hashlib.sha256()
    for item in items:
        digest.update(f"{item.y}:{float(item.x.double().sum()):.6f};".encode())
    return digest.hexdigest()[:16]


def cache_key(model: str, lr: float, settings: CalibrationSettings, items: Sequence[StreamItem]) -> str:
    text = json.dumps(
        {"v": CALIBRATION_VERSION, "model": model, "lr": lr, "settings": settings.to_dict(), "n": len(items)},
        sort_keys=True,
    )
    return f"{hashlib.sha256(text.encode()).hexdigest()[:12]}-{_head_digest(items)}"


def stream_head(
    args: argparse.Namespace, dataset: Dataset, input_shape: tuple[int, ...], count: int
) -> list[StreamItem]:
    """The first ``count`` items of the stream ``ferret simulate`` runs with ``args`` (its length, seed and
    task balance): what a service sees before it plans."""
    total = len(dataset.y_train) if args.items is None else min(args.items, len(dataset.y_train))
    stream = iter_stream(dataset, limit=total, seed=args.seed, input_shape=input_shape, per_task=True)
    return list(itertools.islice(stream, min(count, total)))


def calibrated_cost(
    *,
    model: str,
    build_units: Callable[[int], Sequence[nn.Module]],
    head: list[StreamItem],
    settings: CalibrationSettings,
    source: str,
    cache_dir: Path | None,
) -> tuple[StalenessCost, Path | None]:
    """The cost measured on ``head`` (cached under ``cache_dir/staleness`` when given) and its file."""
    if len(head) < 2 * (max(settings.staleness) + 1):
        raise ConfigError(
            f"the staleness calibration needs at least {2 * (max(settings.staleness) + 1)} items of the stream's head, "
            f"got {len(head)}; give a longer stream or --calibration-items"
        )
    path = None
    if cache_dir is not None:
        path = cache_dir / "staleness" / f"{cache_key(model, settings.lr, settings, head)}.json"
        if path.exists():
            return load_cost(path), path
    runs = (1 + len(settings.every) + len(settings.staleness)) * len(settings.seeds)
    done = itertools.count(1)

    def progress(what: str) -> None:
        print(f"ferret: staleness calibration {next(done)}/{runs}: {what}", file=sys.stderr, flush=True)

    cost = calibrate_staleness(model, lambda seed: (build_units(seed), head), settings, source=source, on_run=progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(cost.to_dict(), indent=1, sort_keys=True) + "\n")
        temporary.replace(path)  # concurrent runs of a bench write the same content; the last rename wins
    return cost, path
