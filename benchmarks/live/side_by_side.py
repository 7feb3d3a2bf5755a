"""The side-by-side users care about (issue 7 "Must show"): the same items at 0.25×…4× of the plain loop's
measured saturation rate, each through (a) the plain reference consumer (``plain_loop.py``), (b) ``ferret
run --method 1-skip``, (c) ``ferret run`` (Ferret, unconstrained), (d) Ferret at 60 % of (c)'s planned bytes
at that rate. One local broker serves every run (its own topics each); every run is a fresh process (so a
fresh model). See README.md.

    .venv/bin/python -m benchmarks.live.side_by_side                       # MNIST/MNISTNet → results/
    .venv/bin/python -m benchmarks.live.side_by_side --items 1200 --multipliers 0.25 0.5 1 2 4
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks.service import harness as h
from ferret_core.data import Dataset, dataset_spec, load_dataset
from services.config import ProducerSettings, load_settings
from services.config.data_root import default_data_root
from services.kafka.admin import ensure_topics
from services.localstack import LocalStack
from services.producer import SampleProducer
from services.proto_gen.ferret.v1 import messages_pb2

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

RESULTS = HERE / "results"
CONFIGS = ("plain", "1-skip", "ferret", "ferret-60%", "ferret-calibrated", "ferret-glibc-heap", "ferret-nice0")
CALIBRATED = {"FERRET_TRAINER_CALIBRATE_TIME": "true"}  # ferret-calibrated: the start-up plan in this machine's time
# unconstrained Ferret with one setting changed, each paired with "ferret" in the goals: ferret-glibc-heap, the
# trainer and its executors with glibc's heap defaults (trainer.retain_freed_memory: false, ferret_core/engine/heap.py);
# ferret-nice0, the record path at its executors' priority (trainer.record_path_nice: 0, services/trainer/priority.py)
VARIANTS = {
    "ferret-calibrated": CALIBRATED,
    "ferret-glibc-heap": {"FERRET_TRAINER_RETAIN_FREED_MEMORY": "false"},
    "ferret-nice0": {"FERRET_TRAINER_RECORD_PATH_NICE": "0"},
}
DISPATCHED = messages_pb2.TRAINING_DECISION_DISPATCHED
WARMUP_ITEMS = 100  # per run, unlabelled, before the measured stream (warm_up)
SETTLE_S = 1.0  # after the warm-up stream's predictions are back (a re-plan's pause is over by then)


class SharedStack:
    """One local stack for every run (each run has its own topic prefix and group): ``start``/``stop`` as
    :class:`LocalStack` has them, so :class:`harness.Service` uses it instead of starting its own."""

    def __init__(self, stack: LocalStack) -> None:
        self._stack = stack

    def start(self) -> SharedStack:
        return self

    def stop(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack, name)


class LiveService(h.Service):
    """``ferret run`` as a separate process for one (dataset, model, method, budget)."""

    def __init__(
        self, dataset: str, model: str, method: str, budget_bytes: int | None, extra_env: dict[str, str] | None = None
    ) -> None:
        super().__init__(model, budget_bytes=budget_bytes)
        self.dataset, self.method = dataset, method
        self.extra_env = dict(extra_env or {})

    def trainer_env(self) -> dict[str, str]:
        env = {**super().trainer_env(), **self.extra_env}
        env["FERRET_TRAINER_DATASET"] = self.dataset
        env["FERRET_TRAINER_METHOD"] = self.method
        env["FERRET_TRAINER_PROFILE"] = str(profile_path(self.dataset, self.model))
        return env


def profile_path(dataset: str, model: str) -> Path:
    """The committed profile of ``model`` at ``dataset``'s input: ``{model}-{dataset}.json`` where one exists
    (digits: MLP on 8×8, made with ``ferret profile --model mlp --in-features 64``,
    benchmarks/profiles/README.md), else ``{model}.json`` when it was taken at the dataset's input shape
    (MNIST's 28×28 for MNISTNet, CIFAR-10's 3×32×32 for ConvNet)."""
    profiles = ROOT / "benchmarks" / "profiles"
    specific = profiles / f"{model}-{dataset}.json"
    if specific.exists():
        return specific
    general = profiles / f"{model}.json"
    shape, _ = dataset_spec(dataset)
    if general.exists() and tuple(json.loads(general.read_text())["input_shape"]) == tuple(shape):
        return general
    raise SystemExit(f"no committed profile of {model} at {dataset}'s input {shape}: make it with `ferret profile`")


def read_predictions(bootstrap: str, topic: str, stream: str, expected: int, timeout: float) -> list[Any]:
    """Every distinct prediction of ``stream`` on ``topic``, read from the beginning of every partition.

    The partitions are assigned, not subscribed: a fresh consumer group's join cost ~20 s per read on the
    local broker (two reads per run: most of a run's time, and why the first committed run hit its 900 s
    limit in the 4× row)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"live-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    seen: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        while len(seen) < expected and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.2):
                if message.error():
                    continue
                p = messages_pb2.Prediction.FromString(message.value())
                if p.stream == stream:
                    seen.setdefault(p.sequence, p)
    finally:
        consumer.close()
    return [seen[k] for k in sorted(seen)]


def warm_up(dataset: Dataset, kafka: Any, rate: float) -> str:
    """``WARMUP_ITEMS`` unlabelled items at ``rate`` (predicted, never trained: the model stays fresh); they
    declare the rate (Ferret re-plans for it) and warm up torch and the clients. Returns the stream's name."""
    stream = f"warmup-{uuid.uuid4().hex[:6]}"
    options = ProducerSettings(rate=rate, items=WARMUP_ITEMS, stream=stream, labels="none")
    report = SampleProducer(dataset, kafka, options, create_topics=False).run()
    if not report.ok:
        raise RuntimeError(f"warm-up at {rate:.0f}/s: {report.failure_reason()}")
    return stream


def _row(config: str, rate: float, items: int, **values: Any) -> dict[str, Any]:
    return {"config": config, "rate": rate, "items": items, **values}


def item_log(entries: dict[int, tuple[int, int, int]]) -> dict[str, Any]:
    """Per measured item, by the producer's sequence number (0 … items−1), compactly: ``correct`` and
    ``trained`` as strings of 0/1 (``-`` where the item was not predicted) and ``updates`` the optimizer
    updates the model had taken when it predicted the item (a Prediction's ``model_version``)."""
    n = 1 + max(entries, default=-1)
    get = [entries.get(k) for k in range(n)]
    return {
        "correct": "".join("-" if e is None else str(e[0]) for e in get),
        "trained": "".join("-" if e is None else str(e[1]) for e in get),
        "updates": [-1 if e is None else e[2] for e in get],
    }


def producer_options(rate: float, items: int, stream: str, repeat: int) -> ProducerSettings:
    """The measured stream of one repeat: the dataset's first ``items`` in order at repeat 0 (as every
    earlier table), a permutation with seed ``repeat`` after (the producer's own ``shuffle``/``seed``);
    every config of a repeat gets the same items in the same order."""
    return ProducerSettings(rate=rate, items=items, stream=stream, shuffle=repeat > 0, seed=repeat)


def run_ferret(
    dataset: Dataset,
    dataset_name: str,
    model: str,
    method: str,
    budget: int | None,
    rate: float,
    items: int,
    repeat: int = 0,
    *,
    variant: str | None = None,
) -> dict[str, Any]:
    """One run of the trainer; ``variant``: a key of :data:`VARIANTS` (unconstrained Ferret, one setting changed)."""
    config = "ferret" if method == "ferret" and budget is None else ("ferret-60%" if method == "ferret" else method)
    if variant is not None:
        config = variant
    stream = f"s{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    with LiveService(dataset_name, model, method, budget, VARIANTS.get(variant or "")) as service:
        assert service.client is not None
        phases["start_s"] = time.monotonic() - t0
        sampler = h.Sampler(service.client, service.pids, interval=0.5)
        try:
            kafka = service.settings.kafka
            warm = warm_up(dataset, kafka, rate)
            if (
                len(read_predictions(kafka.bootstrap_servers, kafka.topics.predictions, warm, WARMUP_ITEMS, 60))
                < WARMUP_ITEMS
            ):
                raise RuntimeError(f"{config} at {rate:.0f}/s: the warm-up stream was not predicted within 60 s")
            phases["warm_up_s"] = time.monotonic() - t0 - phases["start_s"]
            time.sleep(SETTLE_S)
            began = time.monotonic()
            report = SampleProducer(
                dataset, service.settings.kafka, producer_options(rate, items, stream, repeat), create_topics=False
            ).run()
            if not report.ok:
                raise RuntimeError(f"{config} at {rate:.0f}/s: {report.failure_reason()}")
            produced = time.monotonic()  # CPU shares over the stream (+1 s), not the read-back's group join
            phases["produce_s"] = produced - began
            preds = read_predictions(kafka.bootstrap_servers, kafka.topics.predictions, stream, report.produced, 180)
            ended = time.monotonic()
            phases["read_back_s"] = ended - produced
            status = service.client.get_status()
            plan = json.loads(service.client.get_plan().plan_json)
            window = sampler.between(began, min(ended, produced + 1.0))
        finally:
            sampler.close()
        stopping = time.monotonic()
    phases["stop_s"] = time.monotonic() - stopping
    labelled = [p for p in preds if p.has_label]
    latencies = [p.latency_ms for p in preds]
    peak = max([s.status["measured_bytes"] for s in window] + [status.measured_bytes])
    return _row(
        config, rate, report.produced,
        predicted=len(preds),
        online_accuracy=100 * sum(p.correct for p in labelled) / len(labelled) if labelled else math.nan,
        trained_pct=100 * sum(p.decision == DISPATCHED for p in preds) / max(1, report.produced),
        p50_ms=h.quantile(latencies, 0.5), p99_ms=h.quantile(latencies, 0.99),
        peak_bytes=peak, planned_bytes=status.predicted_bytes,
        budget_bytes=status.budget_bytes if status.HasField("budget_bytes") else None,
        broker_cores=h.cpu_shares(window).get("broker", math.nan),
        trainer_cores=h.cpu_shares(window).get("trainer", math.nan),
        replans=status.replans, skipped=dict(status.items_skipped),
        compensations_truncated=status.counters.get("compensations_truncated", 0),
        plan=f"{plan['num_stages']}×{plan['live_workers']}", arrival_interval_ms=1000 * plan["arrival_interval"],
        min_feasible_bytes=plan["min_feasible_bytes"],
        phases_s={k: round(v, 2) for k, v in phases.items()}, total_s=round(time.monotonic() - t0, 2),
        load_average=h.load_average(),
        per_item=item_log({p.sequence: (int(p.correct), int(p.decision == DISPATCHED), p.model_version)
                           for p in labelled}),
    )  # fmt: skip


def run_plain(
    stack: SharedStack, dataset: Dataset, dataset_name: str, model: str, rate: float, items: int, repeat: int = 0
) -> dict[str, Any]:
    stream = f"s{uuid.uuid4().hex[:6]}"
    prefix = f"plain-{uuid.uuid4().hex[:6]}"
    ensure_topics(stack.bootstrap_servers, prefix)
    settings = load_settings(
        None, env={"FERRET_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "FERRET_KAFKA_TOPIC_PREFIX": prefix}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.live.plain_loop", "--dataset", dataset_name, "--model", model,
         "--bootstrap", stack.bootstrap_servers, "--prefix", prefix, "--items", str(items + WARMUP_ITEMS)],
        stdout=subprocess.PIPE, cwd=ROOT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "READY":
        raise RuntimeError("the plain loop did not start")
    warm_up(dataset, settings.kafka, rate)
    time.sleep(SETTLE_S)
    broker = stack.broker.pid if stack.broker else None
    cpu0, t0 = h.cpu_seconds(broker), time.monotonic()
    report = SampleProducer(
        dataset, settings.kafka, producer_options(rate, items, stream, repeat), create_topics=False
    ).run()
    out, _ = proc.communicate(timeout=300)
    span = time.monotonic() - t0
    broker_cores = (h.cpu_seconds(broker) - cpu0) / span
    result = json.loads(out.strip().splitlines()[-1])
    latencies = result["latencies_ms"]
    return _row(
        "plain", rate, report.produced,
        predicted=result["labelled"],
        online_accuracy=100 * result["correct"] / max(1, result["labelled"]),
        trained_pct=100 * result["trained"] / max(1, report.produced),
        p50_ms=h.quantile(latencies, 0.5), p99_ms=h.quantile(latencies, 0.99),
        peak_bytes=None, planned_bytes=None, budget_bytes=None,
        broker_cores=broker_cores, trainer_cores=result["cpu_s"] / span, plan="1 loop",
        load_average=h.load_average(),
        per_item=item_log({int(k): tuple(v) for k, v in result["per_item"].items()}),
    )  # fmt: skip


def saturation_rate(dataset_name: str, model: str, items: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.live.plain_loop", "--dataset", dataset_name, "--model", model,
         "--saturation", str(items)],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    return dict(json.loads(out.strip().splitlines()[-1]))


def mib(value: float | None) -> str:
    return "—" if value is None else f"{value / 2**20:.1f}"


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (s / √n; NaN with fewer than 2 values)."""
    finite = [v for v in values if v is not None and not math.isnan(v)]
    if not finite:
        return math.nan, math.nan
    mean = sum(finite) / len(finite)
    if len(finite) < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in finite) / (len(finite) - 1)
    return mean, math.sqrt(var / len(finite))


def pm(values: list[float], digits: int = 1) -> str:
    """``mean ± s.e.`` (just the value for one run)."""
    mean, se = mean_se(values)
    if math.isnan(mean):
        return "—"
    return f"{mean:.{digits}f}" if math.isnan(se) else f"{mean:.{digits}f} ± {se:.{digits}f}"


def cells(rows: list[dict[str, Any]]) -> dict[tuple[str, float], dict[int, dict[str, Any]]]:
    """Rows by (config, multiplier), then by repeat (rows of a JSON without repeats are repeat 0)."""
    out: dict[tuple[str, float], dict[int, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["config"], r["multiplier"]), {})[r.get("repeat", 0)] = r
    return out


def paired(
    by: dict[tuple[str, float], dict[int, dict[str, Any]]], a: str, b: str, m: float, key: str = "online_accuracy"
) -> list[float]:
    """``a − b`` of ``key`` per repeat that has both (the same items: a paired difference)."""
    ra, rb = by.get((a, m), {}), by.get((b, m), {})
    return [ra[k][key] - rb[k][key] for k in sorted(set(ra) & set(rb))]


def judged(diffs: list[float], threshold: float, strict: bool = False) -> str:
    """``mean ± s.e. (n)``, met/missed against ``diff ≥ threshold`` (``> threshold`` when ``strict``), and
    "within noise" where |mean − threshold| < 2 s.e."""
    mean, se = mean_se(diffs)
    if math.isnan(mean):
        return "no runs"
    met = mean > threshold if strict else mean >= threshold
    text = f"{mean:+.1f}" + ("" if math.isnan(se) else f" ± {se:.1f}") + f" (n = {len(diffs)})"
    verdict = "met" if met else f"**missed by {abs(threshold - mean):.1f} points**"
    noise = "" if math.isnan(se) or abs(mean - threshold) >= 2 * se else ", within noise (|diff − goal| < 2 s.e.)"
    return f"{text}: {verdict}{noise}"


def goals(rows: list[dict[str, Any]], multipliers: list[float]) -> list[str]:
    """Each goal per rate on the paired differences (per repeat, the same items): mean ± s.e., met or
    missed by how much (points of online accuracy), and whether that is within noise."""
    by = cells(rows)
    lines = []
    for m in multipliers:
        plain = by.get(("plain", m), {})
        if not plain or not by.get(("ferret", m)):
            continue
        trained = [r["trained_pct"] for r in plain.values()]
        keeps_up = min(trained) >= 99.0
        gap = paired(by, "ferret", "plain", m)
        if keeps_up:
            lines.append(f"- {m}×: plain keeps up ({pm(trained, 0)} % trained): Ferret − plain = "
                         f"{judged(gap, -0.5)} (goal ≥ −0.5)")  # fmt: skip
            lean = paired(by, "ferret-60%", "ferret", m)
            if lean:
                lines.append(f"  - 60 % budget − unconstrained = {judged(lean, -2.0)} (goal ≥ −2)")
        elif m < 2:
            mean, se = mean_se(gap)
            lines.append(f"- {m}×: plain trained {pm(trained)} % (below 99 % in some repeat: not judged): Ferret − "
                         f"plain = {mean:+.1f}" + ("" if math.isnan(se) else f" ± {se:.1f}"))  # fmt: skip
        if m >= 2:
            lines.append(f"- {m}×: Ferret − plain = {judged(gap, 0.0, strict=True)} (goal > 0)")
        for variant, what in (("ferret-calibrated", "calibrated − profile-timed Ferret"),
                              ("ferret-glibc-heap", "glibc's heap defaults − freed memory kept"),
                              ("ferret-nice0", "record path at the executors' priority − 10 below")):  # fmt: skip
            diff = paired(by, variant, "ferret", m)
            if diff:
                mean, se = mean_se(diff)
                lines.append(f"  - {m}×: {what} = {mean:+.1f}"
                             + ("" if math.isnan(se) else f" ± {se:.1f}") + f" (n = {len(diff)})")  # fmt: skip
    return lines


def render(payload: dict[str, Any]) -> str:
    rows, multipliers = payload["rows"], payload["multipliers"]
    repeats = payload.get("repeats", 1)
    by = cells(rows)
    out = [
        f"# Live side-by-side: {payload['dataset']}/{payload['model']}, {payload['items']} items per run, "
        f"{repeats} repeat{'s' if repeats > 1 else ''}",
        "",
        f"Command: `{payload['command']}` at {payload['commit']} — {payload['machine']['cpus']} CPUs, "
        f"torch {payload['machine']['torch']}. "
        f"Load average (1/5/15 min) {payload['load_before']} before, {payload['load_after']} after "
        f"(each run's own is in the JSON). Total {payload['seconds']:.0f} s.",
        "",
        *(
            [
                f"Plain-loop rows rerun (same rates) with `{payload['plain_rerun']['command']}` at "
                f"{payload['plain_rerun']['commit']}, load average {payload['plain_rerun']['load_average']} after.",
                "",
            ]
            if payload.get("plain_rerun")
            else []
        ),
        f"Plain loop's measured saturation (predict + one SGD step, no Kafka, {payload['saturation']['items']} "
        f"items): **{payload['saturation']['items_per_s']:.0f} items/s** "
        f"({payload['saturation']['ms_per_item']:.2f} ms/item); rates below are multiples of it.",
        "",
    ]
    if repeats > 1:
        out += [
            f"Every cell is the mean ± standard error over {repeats} repeats (each a fresh process and fresh "
            "model; repeat 0 streams the dataset's first items in order, repeat r > 0 the same number shuffled "
            "with seed r, the same items for every config of a repeat; cells interleaved: the rates' order "
            "alternates and the configs' order rotates from repeat to repeat). Per-run values and, per item, "
            "which were predicted correctly and which were trained are in the JSON (`per_item`).",
            "",
        ]
    for m in multipliers:
        rate = m * payload["saturation"]["items_per_s"]
        out += [
            f"## {m}× ({rate:.0f} items/s)",
            "",
            "| run | plan | online acc. % | trained % | p50 ms | p99 ms | peak MiB | budget MiB | broker cores "
            "| trainer cores |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for config in CONFIGS:
            runs = list(by.get((config, m), {}).values())
            if not runs:
                continue
            plans = sorted({r["plan"] for r in runs})
            peak = [r["peak_bytes"] for r in runs if r["peak_bytes"] is not None]
            budget = [r["budget_bytes"] for r in runs if r["budget_bytes"] is not None]
            out.append(
                f"| {config} | {'/'.join(plans)} | {pm([r['online_accuracy'] for r in runs])} | "
                f"{pm([r['trained_pct'] for r in runs])} | {pm([r['p50_ms'] for r in runs], 0)} | "
                f"{pm([r['p99_ms'] for r in runs], 0)} | {mib(max(peak)) if peak else '—'} | "
                f"{mib(max(budget)) if budget else '—'} | {pm([r['broker_cores'] for r in runs], 2)} | "
                f"{pm([r['trainer_cores'] for r in runs], 2)} |"
            )
        out.append("")
    out += [
        "## Goals (paired differences: per repeat, the same items; mean ± s.e.)",
        "",
        *goals(rows, multipliers),
        "",
        "Peak MiB / budget MiB: the largest over the repeats.",
        "",
    ]
    notes = payload.get("notes", [])
    if notes:
        out += ["## Notes on this run", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(out)


def plot(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = cells(payload["rows"])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for config in CONFIGS:
        ms = sorted(m for c, m in by if c == config)
        if not ms:
            continue
        stats = [mean_se([r["online_accuracy"] for r in by[(config, m)].values()]) for m in ms]
        ax.errorbar(ms, [s[0] for s in stats], yerr=[0 if math.isnan(s[1]) else s[1] for s in stats],
                    marker="o", capsize=3, label=config)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rate (× the plain loop's measured saturation)")
    ax.set_ylabel("online accuracy (%), mean ± s.e.")
    ax.set_title(f"{payload['dataset']}/{payload['model']}, {payload['items']} items, "
                 f"{payload.get('repeats', 1)} repeat(s)")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def schedule(
    multipliers: list[float], repeats: int, configs_run: list[str] | None = None
) -> list[tuple[int, float, str]]:
    """(repeat, multiplier, config) in run order: repeat by repeat, the rates in order at even repeats and
    reversed at odd ones, the configs rotated by one more each repeat (so a slow drift of the machine
    falls on every cell alike, not on one config or one rate)."""
    order: list[tuple[int, float, str]] = []
    for r in range(repeats):
        ms = multipliers if r % 2 == 0 else list(reversed(multipliers))
        k = r % len(CONFIGS)
        configs = CONFIGS[k:] + CONFIGS[:k]
        order += [(r, m, c) for m in ms for c in configs if configs_run is None or c in configs_run]
    return order


def run_all(
    stack: SharedStack, dataset: Dataset, args: argparse.Namespace, sat: dict[str, float]
) -> list[dict[str, Any]]:
    """Every cell of :func:`schedule`. Ferret at 60 %: 60 % of the unconstrained run's planned bytes at
    that rate (the latest one run, of this repeat or an earlier), never below what any plan needs (the
    planner refuses less); a 60 % cell whose rate has no unconstrained run yet runs it first."""
    rows: list[dict[str, Any]] = []
    unconstrained: dict[float, dict[str, Any]] = {}
    for repeat, m, config in schedule(args.multipliers, args.repeats, args.configs):
        rate = m * sat["items_per_s"]
        if config == "plain":
            row = run_plain(stack, dataset, args.dataset, args.model, rate, args.items, repeat)
        elif config == "1-skip":
            row = run_ferret(dataset, args.dataset, args.model, "1-skip", None, rate, args.items, repeat)
        elif config == "ferret":
            row = run_ferret(dataset, args.dataset, args.model, "ferret", None, rate, args.items, repeat)
            unconstrained[m] = row
        elif config in VARIANTS:
            row = run_ferret(
                dataset, args.dataset, args.model, "ferret", None, rate, args.items, repeat, variant=config
            )
        else:
            if m not in unconstrained:
                raise RuntimeError(f"ferret-60% at {m}× before any unconstrained run (schedule() order)")
            ref = unconstrained[m]
            budget = max(round(0.6 * ref["planned_bytes"]), ref["min_feasible_bytes"])
            row = run_ferret(dataset, args.dataset, args.model, "ferret", budget, rate, args.items, repeat)
        row["multiplier"], row["repeat"] = m, repeat
        print(json.dumps({k: v for k, v in row.items() if k not in ("load_average", "per_item")}), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="mnistnet")
    parser.add_argument("--items", type=int, default=1200)
    parser.add_argument("--multipliers", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--saturation-items", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=1, help="runs per cell (tables: mean ± s.e.)")
    parser.add_argument(
        "--configs", nargs="+", choices=CONFIGS, default=None, help="run only these configs (default: all)"
    )
    parser.add_argument("--out", default=None, help="results name (default side_by_side-DATASET-MODEL)")
    parser.add_argument("--render-only", action="store_true", help="rewrite the .md and .png from the JSON")
    parser.add_argument(
        "--rerun-plain", action="store_true", help="rerun only the plain loop's rows of the JSON (same rates)"
    )
    args = parser.parse_args(argv)
    name = args.out or f"side_by_side-{args.dataset}-{args.model}"
    if args.render_only:
        payload = json.loads((RESULTS / f"{name}.json").read_text())
    elif args.rerun_plain:
        payload = json.loads((RESULTS / f"{name}.json").read_text())
        dataset = load_dataset(args.dataset, default_data_root())
        stack = SharedStack(LocalStack().start())
        try:
            for i, row in enumerate(payload["rows"]):
                if row["config"] == "plain":
                    fresh = run_plain(
                        stack, dataset, args.dataset, args.model, row["rate"], payload["items"], row.get("repeat", 0)
                    )
                    fresh["multiplier"], fresh["repeat"] = row["multiplier"], row.get("repeat", 0)
                    print(json.dumps({k: v for k, v in fresh.items() if k != "load_average"}), flush=True)
                    payload["rows"][i] = fresh
        finally:
            stack._stack.stop()
        payload["plain_rerun"] = {
            "command": "python -m benchmarks.live.side_by_side " + " ".join(sys.argv[1:] if argv is None else argv),
            "commit": h.git_head(),
            "load_average": h.load_average(),
        }
        (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    else:
        began, load_before = time.monotonic(), h.load_average()
        dataset = load_dataset(args.dataset, default_data_root())
        sat = saturation_rate(args.dataset, args.model, args.saturation_items)
        stack = SharedStack(LocalStack().start())
        h.LocalStack = lambda: stack  # type: ignore[assignment,misc]  # the services use the shared stack
        try:
            rows = run_all(stack, dataset, args, sat)
        finally:
            stack._stack.stop()
        payload = {
            "dataset": args.dataset, "model": args.model, "items": args.items, "multipliers": args.multipliers,
            "repeats": args.repeats,
            "command": "python -m benchmarks.live.side_by_side " + " ".join(sys.argv[1:] if argv is None else argv),
            "commit": h.git_head(), "machine": h.machine(), "saturation": sat, "rows": rows,
            "load_before": load_before, "load_after": h.load_average(), "seconds": time.monotonic() - began,
        }  # fmt: skip
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    (RESULTS / f"{name}.md").write_text(render(payload))
    plot(payload, RESULTS / f"{name}.png")
    print(render(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
