"""The plain-loop baseline beside Ferret in the demo's report: what the loop a user
would write instead (predict each item, one SGD step per item with the same model, lr and optimizer, skip
while busy; ``benchmarks/live/plain_loop.py`` runs it live) reaches on **the same items arriving at the
same measured times**.

It is replayed on a virtual clock, so the demo needs no second live run: the items are the demo's
(its producer sends train row ``sequence`` as item ``sequence``), their arrival times are the event
times the predictions carry (``predicted_time_ms − latency_ms``), and every predict and every SGD step
really runs and advances the clock by the time it measurably took on this machine. One thread in arrival
order: the loop reaches an item at ``max(event time, when it finished the previous one)``; it predicts
it, then trains on it only if it reached it within ``max_age_s`` of its event time (older: it waited
behind earlier work, so it is skipped as busy, as the live reference does). What the replay leaves out:
the Kafka hop (both directions) and the CPU the broker and the trainer shared with the loop, so it is
an upper bound of the live plain loop at that rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class DemoPrediction(Protocol):
    """What the replay reads of a prediction read back (``services.demo.collect.PredictionRecord``)."""

    @property
    def sample_id(self) -> str: ...  # "<stream>/<sequence>"
    @property
    def has_label(self) -> bool: ...
    @property
    def duplicate(self) -> bool: ...
    @property
    def latency_ms(self) -> float: ...
    @property
    def predicted_time_ms(self) -> int: ...


MAX_AGE_S = 0.2  # as benchmarks/live/plain_loop.py's MAX_AGE_MS


@dataclass(frozen=True, slots=True)
class BaselineItem:
    event_time_s: float
    x: torch.Tensor  # one sample, no batch dimension, as the trainer decodes it
    label: int


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """The replayed plain loop: running online accuracy (percent) at each prediction's virtual time
    (seconds after the first item's event time), items, trained, and the measured compute per item."""

    origin_s: float  # the first item's event time (seconds since the epoch when from a demo)
    seconds: tuple[float, ...]
    running: tuple[float, ...]
    items: int
    correct: int
    trained: int
    predict_ms: float  # mean measured time of one prediction
    train_ms: float  # mean measured time of one SGD step (nan when none)

    @property
    def accuracy(self) -> float | None:
        return 100.0 * self.correct / self.items if self.items else None


def replay_plain_loop(
    items: Sequence[BaselineItem],
    model: nn.Module,
    lr: float,
    *,
    max_age_s: float = MAX_AGE_S,
    clock: Callable[[], float] = time.perf_counter,
) -> BaselineResult:
    """Run the plain loop over ``items`` (sorted by event time here) on a virtual clock advanced by the
    measured time of each predict and SGD step (``torch.optim.SGD(lr)``, no momentum: DESIGN §3.11)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    ordered = sorted(items, key=lambda item: item.event_time_s)
    origin = ordered[0].event_time_s if ordered else 0.0
    free_at = origin
    seconds: list[float] = []
    running: list[float] = []
    correct = trained = 0
    predict_total = train_total = 0.0
    for n, item in enumerate(ordered, start=1):
        reached = max(item.event_time_s, free_at)
        began = clock()
        with torch.no_grad():
            prediction = int(model(item.x.unsqueeze(0)).argmax(1).item())
        took = clock() - began
        predict_total += took
        done = reached + took
        correct += int(prediction == item.label)
        seconds.append(done - origin)
        running.append(100.0 * correct / n)
        if done - item.event_time_s <= max_age_s:
            began = clock()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(item.x.unsqueeze(0)), torch.tensor([item.label]))
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            took = clock() - began
            train_total += took
            done += took
            trained += 1
        free_at = done
    return BaselineResult(
        origin_s=origin,
        seconds=tuple(seconds),
        running=tuple(running),
        items=len(ordered),
        correct=correct,
        trained=trained,
        predict_ms=1000 * predict_total / len(ordered) if ordered else float("nan"),
        train_ms=1000 * train_total / trained if trained else float("nan"),
    )


@contextmanager
def trainer_model(dataset: str, model: str) -> Iterator[tuple[nn.Module, float]]:
    """The trainer's model for ``dataset`` (its initial weights, as one module) and its lr, with torch set to
    the trainer's threads while the block runs."""
    from services.config import load_settings
    from services.trainer.runner import build_zoo_model

    settings = load_settings(None, env={"FERRET_TRAINER_DATASET": dataset, "FERRET_TRAINER_MODEL": model})
    threads = torch.get_num_threads()
    torch.set_num_threads(settings.trainer.threads)
    try:
        yield build_zoo_model(settings).as_sequential(), settings.trainer.lr
    finally:
        torch.set_num_threads(threads)


def demo_baseline(
    records: Sequence[DemoPrediction], dataset: str, model: str, data_root: Path | None, lr: float | None = None
) -> BaselineResult | None:
    """The replay for a demo's predictions (the labelled, distinct ones; train row ``sequence`` is the item,
    as ``ferret produce`` numbers them unshuffled; its label is the one the producer sent), with the
    trainer's model, initial weights, torch threads and lr (``trainer.lr`` unless ``lr``). None when no
    prediction had a label."""
    import numpy as np

    from ferret_core.data import load_dataset, normalise

    labelled = {int(r.sample_id.rsplit("/", 1)[1]): r for r in records if r.has_label and not r.duplicate}
    if not labelled:
        return None
    data = load_dataset(dataset, data_root)
    n = len(data.y_train)
    items = [
        BaselineItem(
            (r.predicted_time_ms - r.latency_ms) / 1000,
            normalise(np.ascontiguousarray(data.x_train[seq % n])),
            int(data.y_train[seq % n]),  # the label the producer sent with the sample
        )
        for seq, r in labelled.items()
    ]
    with trainer_model(dataset, model) as (zoo, trainer_lr):
        return replay_plain_loop(items, zoo, trainer_lr if lr is None else lr)


def plain_loop_rate(dataset: str, model: str, *, items: int = 80, warmup: int = 20) -> float:
    """Items per second the plain loop predicts *and* trains on this machine (with the trainer's model,
    torch threads and lr, on random inputs of the dataset's shape; :func:`replay_plain_loop`'s measured
    predict and SGD step, items far enough apart that every one is trained, after ``warmup`` of them):
    the stream rate above which one sequential loop cannot keep up. The demo streams at
    :data:`services.demo.options.RATE_OVER_PLAIN` times this by default (``ferret demo`` without ``--rate``)."""
    from ferret_core.data import dataset_spec

    shape, classes = dataset_spec(dataset)
    gen = torch.Generator().manual_seed(0)
    xs = torch.rand((warmup + items, *shape), generator=gen)
    ys = torch.randint(0, classes, (warmup + items,), generator=gen).tolist()
    spaced = [BaselineItem(float(k), xs[k], ys[k]) for k in range(warmup + items)]  # 1 s apart: all trained
    with trainer_model(dataset, model) as (net, lr):
        replay_plain_loop(spaced[:warmup], net, lr)
        run = replay_plain_loop(spaced[warmup:], net, lr)
    return 1000.0 / (run.predict_ms + run.train_ms)
