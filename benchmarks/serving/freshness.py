"""Serving beside a trainer at saturation (issue 25 "Must show"): model freshness, Predict latency, bytes per
model update, and the export round trip, on MNIST / MNISTNet.

Set-up: the embedded local stack (Tansu + Valkey), ``ferret run`` (MNISTNet, the committed profile, models
published every ``--interval`` s) and ``ferret serve`` as separate processes, as in
``benchmarks.service.harness``. A stream of MNIST train items at ``--rate`` items/s (default 168: the
trainer's measured saturation rate, benchmarks/service/results/saturation.md) for ``--seconds`` s.

Measured, in the same run:
1. **freshness** per model update: serving's arrival time (the follower put it in force) − the trainer's
   update time (the wall time its master was copied for publishing), from ``ferret serve``'s own log line per
   update; and the **age** a client saw: Predict's reply time − the trainer's update time of the model that
   answered (sampled every 50 ms during the stream: it includes the publishing interval).
2. **Predict latency** on loopback (client round trip, batch 1 and batch 64) during the stream and once the
   trainer is idle; beside it, the same run's latency of the samples topic → prediction path (the trainer's
   ``latency_ms``: the way to get a prediction before ``ferret serve``).
3. **bytes per update** (full safetensors weights) and what a delta would cost: for consecutive updates the
   elements that changed (a dense delta is the full size; a sparse one 8 bytes per changed element).
4. **export round trip**: 1,000 MNIST test items sent unlabelled (predicted, never trained), then
   ``ferret export --from-trainer HOST:PORT --torch-export`` (the trainer takes the snapshot it exports), the
   export loaded in a fresh process: its classes and confidences against the trainer's own predictions of
   those items; the same for its ``model.pt2`` loaded by ``torch.export.load`` alone (no project code on the
   path); and ``ferret serve``'s Predict on the same items.

    .venv/bin/python -m benchmarks.serving.freshness              # → results/freshness.{md,json}
    .venv/bin/python -m benchmarks.serving.freshness --interval 0.25 --out freshness-250ms
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import redis
import torch
from confluent_kafka import Consumer

from benchmarks.service import harness as h
from benchmarks.support import write_result
from services.config import ProducerSettings
from services.localstack.ports import free_port
from services.producer.stream import SampleProducer
from services.proto_gen.ferret.v1 import messages_pb2
from services.serving.client import ServingClient
from services.serving.export_files import decode_weights
from services.serving.model_stream import ModelStreamReader, stream_key

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python -m benchmarks.serving.freshness"
FERRET = [sys.executable, "-m", "services.cli.main"]
UPDATE_LINE = re.compile(r"model v(\d+) in force: trainer update (\d+) ms, received (\d+) ms, (\d+) bytes")
ROUND_TRIP_ITEMS = 1000


class ServingService(h.Service):
    """The harness's trainer with the model stream at ``interval_s`` and an address for ``ferret serve``."""

    def __init__(self, model: str, interval_s: float) -> None:
        super().__init__(model)
        self.interval_s = interval_s

    def trainer_env(self) -> dict[str, str]:
        env = super().trainer_env()
        env["FERRET_TRAINER_MODELS_INTERVAL_S"] = str(self.interval_s)
        env["FERRET_SERVING_LISTEN"] = f"127.0.0.1:{free_port()}"
        return env


class Poller:
    """Predict every ``period`` s during the stream: batch 1 then batch 64, timing each round trip and the
    age of the model that answered (reply time − the trainer's update time)."""

    def __init__(self, target: str, xs: np.ndarray, period: float = 0.05) -> None:
        self.client = ServingClient(target)
        self.xs = xs
        self.period = period
        self.ages_ms: list[tuple[float, float]] = []  # (wall ms of the reply, age ms)
        self.latency_ms: dict[int, list[float]] = {1: [], 64: []}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-predict", daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def _loop(self) -> None:
        i = 0
        while not self._stop.wait(self.period):
            for batch in (1, 64):
                start = (i * 64) % (len(self.xs) - 64)
                began = time.perf_counter()
                reply = self.client.predict(self.xs[start : start + batch])
                self.latency_ms[batch].append((time.perf_counter() - began) * 1000)
                now_ms = time.time() * 1000
                self.ages_ms.append((now_ms, now_ms - reply.model_update_time_ms))
            i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class DeltaWatcher:
    """Follows the model stream in this process and, for consecutive updates, counts the changed elements."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.reader = ModelStreamReader(client, key)
        self.rows: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-deltas", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        previous: dict[str, torch.Tensor] | None = None
        after = b"0-0"
        while not self._stop.is_set():
            updates = self.reader.follow(after, 500)
            for update in updates:
                after = update.entry_id
                weights = decode_weights(update.data, "bench")
                if previous is not None:
                    changed = sum(int((weights[k] != previous[k]).sum()) for k in weights)
                    total = sum(t.numel() for t in weights.values())
                    self.rows.append({"version": update.version, "bytes": len(update.data), "changed": changed,
                                      "elements": total})  # fmt: skip
                previous = weights

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def predictions_of(bootstrap: str, topic: str, stream: str, expected: int, timeout_s: float = 120.0) -> list[Any]:
    """The trainer's predictions of ``stream`` (first of each sequence), read by a fresh group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    found: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            p = messages_pb2.Prediction.FromString(message.value())
            if p.stream == stream and p.sequence not in found:
                found[p.sequence] = p
    finally:
        consumer.close()
    return [found[s] for s in sorted(found)]


def settled_version(service: h.Service, timeout_s: float = 120.0) -> int:
    assert service.client is not None
    last, deadline = -1, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        version = int(service.client.get_status().model_version)
        if version == last:
            return version
        last = version
        time.sleep(1.5)
    raise RuntimeError("the trainer's model version kept changing")


def wait_serving(target: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"ferret serve exited: {log.read_text()[-2000:]}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"ferret serve not SERVING after {timeout_s} s: {log.read_text()[-2000:]}")


def idle_latency(target: str, xs: np.ndarray, calls: int) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {1: [], 64: []}
    with ServingClient(target) as client:
        for batch in (1, 64):
            client.predict(xs[:batch])  # warm
            for i in range(calls):
                start = (i * 64) % (len(xs) - 64)
                began = time.perf_counter()
                client.predict(xs[start : start + batch])
                out[batch].append((time.perf_counter() - began) * 1000)
    return out


def round_trip(service: ServingService, target: str, dataset: Any, work: Path) -> dict[str, Any]:
    """1,000 test items unlabelled → the trainer's predictions; snapshot → export → fresh-process load; and
    ferret serve's Predict on the same items."""
    settings = service.settings
    options = ProducerSettings(split="test", items=ROUND_TRIP_ITEMS, stream="roundtrip", labels="none")
    report = SampleProducer(dataset, settings.kafka, options, create_topics=False).run()
    assert report.ok, report.failure_reason()
    trainer = predictions_of(settings.kafka.bootstrap_servers, settings.kafka.topics.predictions, "roundtrip",
                             ROUND_TRIP_ITEMS)  # fmt: skip
    versions = sorted({p.model_version for p in trainer})
    assert service.client is not None
    out = work / "export"
    env = {**os.environ, **service.env}
    command = [*FERRET, "export", "--from-trainer", service.client.target, "--torch-export", "--out", str(out)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"ferret export failed: {done.stderr}")
    exported = json.loads(done.stdout)
    xs = dataset.x_test[:ROUND_TRIP_ITEMS]
    np.save(work / "inputs.npy", xs)
    script = (
        "import json, sys, numpy as np, torch\n"
        "from services.serving.export_files import load_export\n"
        "from services.serving.model_card import predict_probabilities\n"
        "loaded = load_export(sys.argv[1])\n"
        "p = predict_probabilities(loaded.model, torch.from_numpy(np.load(sys.argv[2])).float() / 255)\n"
        "print(json.dumps({'version': loaded.manifest.model_version, 'classes': p.argmax(1).tolist(),"
        " 'confidences': p.max(1).values.tolist()}))\n"
    )
    fresh = subprocess.run([sys.executable, "-c", script, str(out), str(work / "inputs.npy")], cwd=ROOT,
                           env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                           check=False, timeout=300)  # fmt: skip
    if fresh.returncode != 0:
        raise RuntimeError(f"loading the export failed: {fresh.stderr}")
    loaded = json.loads(fresh.stdout)
    torch.save(torch.from_numpy(xs).float() / 255, work / "inputs.pt")
    program_script = (
        "import json, sys, torch\n"
        "program = torch.export.load(sys.argv[1]).module()\n"
        "with torch.no_grad():\n"
        "    p = torch.softmax(program(torch.load(sys.argv[2])), dim=1)\n"
        "print(json.dumps({'classes': p.argmax(1).tolist(), 'confidences': p.max(1).values.tolist(),\n"
        "                  'ours': [m for m in sys.modules if m.split('.')[0] in ('services', 'ferret_core')]}))\n"
    )
    fresh = subprocess.run([sys.executable, "-c", program_script, str(out / "model.pt2"), str(work / "inputs.pt")],
                           cwd=work, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, check=False,
                           timeout=300)  # fmt: skip
    if fresh.returncode != 0:
        raise RuntimeError(f"loading model.pt2 failed: {fresh.stderr}")
    program = json.loads(fresh.stdout)
    if program["ours"]:
        raise RuntimeError(f"loading model.pt2 imported project modules: {program['ours']}")
    classes = [p.predicted_class for p in trainer]
    confidences = np.array([p.confidence for p in trainer])
    served_classes: list[int] = []
    served_conf: list[float] = []
    served_versions: set[int] = set()
    with ServingClient(target) as client:
        deadline = time.monotonic() + 30
        while client.predict(xs[:1]).model_version != exported["model_version"] and time.monotonic() < deadline:
            time.sleep(0.2)
        for start in range(0, ROUND_TRIP_ITEMS, 250):
            reply = client.predict(xs[start : start + 250])
            served_classes += list(reply.classes)
            served_conf += list(reply.confidences)
            served_versions.add(reply.model_version)
    return {
        "items": len(trainer),
        "trainer_versions": versions,
        "export": exported,
        "export_version": loaded["version"],
        "export_classes_equal": sum(a == b for a, b in zip(loaded["classes"], classes, strict=True)),
        "export_max_abs_conf_diff": float(np.max(np.abs(np.array(loaded["confidences"]) - confidences))),
        "pt2_bytes": (out / "model.pt2").stat().st_size,
        "pt2_classes_equal": sum(a == b for a, b in zip(program["classes"], classes, strict=True)),
        "pt2_max_abs_conf_diff": float(np.max(np.abs(np.array(program["confidences"]) - confidences))),
        "serve_versions": sorted(served_versions),
        "serve_classes_equal": sum(a == b for a, b in zip(served_classes, classes, strict=True)),
        "serve_max_abs_conf_diff": float(np.max(np.abs(np.array(served_conf) - confidences))),
    }


def run(rate: float, seconds: float, interval_s: float) -> dict[str, Any]:
    dataset = h.mnist()
    work = Path(tempfile.mkdtemp(prefix="ferret-serving-bench-"))
    with ServingService("mnistnet", interval_s) as service:
        assert service.client is not None
        settings = service.settings
        target = settings.serving.listen
        serve_log = work / "serve.log"
        with serve_log.open("ab") as handle:
            serve = subprocess.Popen([*FERRET, "serve", "--log-level", "INFO", "--metrics-port", "0"],
                                     env={**os.environ, **service.env}, cwd=ROOT, stdout=handle,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        client = redis.Redis.from_url(settings.redis.url)
        try:
            wait_serving(target, serve, serve_log)
            reader = service.reader()
            sampler = h.Sampler(service.client, service.pids)
            watcher = DeltaWatcher(client, stream_key(settings.redis.namespace, settings.kafka.resolved_instance_id()))
            xs = dataset.x_test[:2048]
            poller = Poller(target, xs).start()
            began_ms = time.time() * 1000
            result = h.run_stream(service, reader, sampler, dataset, rate=rate, seconds=seconds, stream="saturation",
                                  drain_timeout=120, exclude_first_s=1.0)  # fmt: skip
            ended_ms = time.time() * 1000
            # the stream's last event time (wall ms): after it the trainer finishes its backlog and idles
            produced_ms = max((p.predicted_time_ms - p.latency_ms for p in reader.get("saturation")), default=ended_ms)
            poller.stop()
            watcher.stop()
            sampler.close()
            reader.close()
            version = settled_version(service)
            idle = idle_latency(target, xs, 200)
            trip = round_trip(service, target, dataset, work)
            status = service.client.get_status()
        finally:
            serve.terminate()
            serve.wait(30)
            client.close()
    updates = [tuple(int(g) for g in m.groups()) for m in UPDATE_LINE.finditer(serve_log.read_text())]
    during = [(v, t, r, b) for v, t, r, b in updates if began_ms <= r <= ended_ms]
    freshness = [r - t for _, t, r, _ in during]
    # the age a client saw while the trainer trained: from the first update that arrived during the stream
    # to the last item's event time (outside that window an idle trainer's newest model only looks old)
    first_ms = min((r for _, _, r, _ in during), default=produced_ms)
    ages = [age for at, age in poller.ages_ms if first_ms <= at <= produced_ms]
    deltas = watcher.rows
    return {
        "command": f"{COMMAND} --rate {rate:g} --seconds {seconds:g} --interval {interval_s:g}",
        "commit": h.git_head(),
        "machine": h.machine(),
        "rate": rate,
        "seconds": seconds,
        "interval_s": interval_s,
        "plan": service.plan,
        "stream": result.as_dict(),
        "updates_during_stream": len(during),
        "freshness_ms": h.summary(freshness),
        "age_ms": h.summary(ages),
        "predict_ms_during": {str(b): h.summary(v) for b, v in poller.latency_ms.items()},
        "predict_ms_idle": {str(b): h.summary(v) for b, v in idle.items()},
        "bytes_per_update": during[-1][3] if during else None,
        "deltas": {
            "pairs": len(deltas),
            "changed_fraction_p50": h.quantile([d["changed"] / d["elements"] for d in deltas], 0.5),
            "changed_fraction_min": min((d["changed"] / d["elements"] for d in deltas), default=float("nan")),
            "sparse_delta_bytes_p50": h.quantile([8 * d["changed"] for d in deltas], 0.5),
        },
        "settled_version": version,
        "trainer_status": {
            "items_received": status.items_received,
            "items_dispatched": status.items_dispatched,
            "model_version": status.model_version,
        },
        "round_trip": trip,
    }


def render(r: dict[str, Any]) -> str:
    f, a, s, t = r["freshness_ms"], r["age_ms"], r["stream"], r["round_trip"]
    during, idle = r["predict_ms_during"], r["predict_ms_idle"]
    full = r["bytes_per_update"] or 0
    d = r["deltas"]
    lines = [
        "# Serving beside a trainer at saturation (MNIST / MNISTNet)",
        "",
        f"Command: `{r['command']}` at commit {r['commit']} — {r['machine'].get('cpus')} CPUs shared with other "
        "engineers' work (run under /tmp/ferret-bench.lock, but their tests may have shared the CPU); trainer, "
        "`ferret serve`, Tansu and Valkey are separate processes on this machine (loopback).",
        "",
        f"Stream: {s['produced']} MNIST train items at {r['rate']:g} items/s for {r['seconds']:g} s "
        f"(predicted/s {s['predicted_per_s']:.1f}, trained/s {s['trained_per_s']:.1f}, busy {s['busy_pct']:.1f} %: "
        f"saturated); models published every {r['interval_s']:g} s (`trainer.models_interval_s`).",
        "",
        "| measure | n | p50 | p90 | p99 | max | goal / alternative |",
        "|---|---|---|---|---|---|---|",
        f"| freshness: serving's arrival − trainer's update (ms) | {f['n']} | {h.fmt(f['p50'])} | {h.fmt(f['p90'])} | "
        f"{h.fmt(f['p99'])} | {h.fmt(f['max'])} | goal p99 ≤ 1,000 ms; Ekko 2,400 ms (cited); p99 = "
        f"{h.fmt(f['p99'] / 2400, 3)} × Ekko's |",
        f"| age of the answering model at Predict (ms) | {a['n']} | {h.fmt(a['p50'])} | {h.fmt(a['p90'])} | "
        f"{h.fmt(a['p99'])} | {h.fmt(a['max'])} | sampled every 50 ms while items arrive; includes the "
        f"wait for the next publication (interval {r['interval_s'] * 1000:,.0f} ms) |",
        f"| Predict batch 1, during the stream (ms) | {during['1']['n']} | {h.fmt(during['1']['p50'], 2)} | "
        f"{h.fmt(during['1']['p90'], 2)} | {h.fmt(during['1']['p99'], 2)} | {h.fmt(during['1']['max'], 2)} | "
        f"samples topic → prediction, same run: p50 {h.fmt(s['p50_ms'])} / p99 {h.fmt(s['p99_ms'])} ms "
        f"({h.fmt(s['p50_ms'] / during['1']['p50'], 0)}× / {h.fmt(s['p99_ms'] / during['1']['p99'], 0)}× Predict's) |",
        f"| Predict batch 64, during the stream (ms) | {during['64']['n']} | {h.fmt(during['64']['p50'], 2)} | "
        f"{h.fmt(during['64']['p90'], 2)} | {h.fmt(during['64']['p99'], 2)} | {h.fmt(during['64']['max'], 2)} | |",
        f"| Predict batch 1, trainer idle (ms) | {idle['1']['n']} | {h.fmt(idle['1']['p50'], 2)} | "
        f"{h.fmt(idle['1']['p90'], 2)} | {h.fmt(idle['1']['p99'], 2)} | {h.fmt(idle['1']['max'], 2)} | |",
        f"| Predict batch 64, trainer idle (ms) | {idle['64']['n']} | {h.fmt(idle['64']['p50'], 2)} | "
        f"{h.fmt(idle['64']['p90'], 2)} | {h.fmt(idle['64']['p99'], 2)} | {h.fmt(idle['64']['max'], 2)} | |",
        "",
        f"Bytes per update (full weights, safetensors): **{full:,}**. Of {d['pairs']} consecutive published "
        f"updates, the median fraction of elements that changed: {h.fmt(100 * d['changed_fraction_p50'], 2)} % "
        f"(min {h.fmt(100 * d['changed_fraction_min'], 2)} %), so a dense delta is the full size and a sparse "
        f"one (index + value, 8 B per changed element) would be {h.fmt(d['sparse_delta_bytes_p50'], 0)} B "
        f"({h.fmt(d['sparse_delta_bytes_p50'] / full if full else float('nan'), 2)}× the full update). Full weights "
        "it is: a follower joining late needs only the newest update (one `XREVRANGE`), never a base plus a chain.",
        "",
        "## Export round trip",
        "",
        f"{t['items']} MNIST test items sent unlabelled after the stream (predicted by the trainer at versions "
        f"{t['trainer_versions']}, never trained); snapshot v{t['export']['snapshot_version']}, taken by the trainer "
        f"when `ferret export --from-trainer HOST:PORT --torch-export` asked, exported (model version "
        f"{t['export']['model_version']}, {t['export']['weights_bytes']:,} bytes of safetensors, {t['pt2_bytes']:,} "
        "bytes of model.pt2), loaded in a fresh process (the safetensors export: no Redis, Kafka or gRPC imported; "
        "model.pt2: `torch.export.load` alone, no project module on the path):",
        "",
        "| predictor | model version | classes equal to the trainer's | max abs confidence difference |",
        "|---|---|---|---|",
        f"| exported model (fresh process) | {t['export_version']} | **{t['export_classes_equal']} / {t['items']}** | "
        f"{t['export_max_abs_conf_diff']:.2e} |",
        f"| model.pt2 via torch.export.load (fresh process) | {t['export']['model_version']} | "
        f"**{t['pt2_classes_equal']} / {t['items']}** | {t['pt2_max_abs_conf_diff']:.2e} |",
        f"| `ferret serve` Predict (batches of 250) | {t['serve_versions']} | **{t['serve_classes_equal']} / "
        f"{t['items']}** | {t['serve_max_abs_conf_diff']:.2e} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=168.0, help="items/s (default 168: saturation, MNISTNet)")
    parser.add_argument("--seconds", type=float, default=40.0, help="stream length (default 40)")
    parser.add_argument("--interval", type=float, default=1.0, help="trainer.models_interval_s (default 1)")
    parser.add_argument("--out", default="freshness", help="results/OUT.{md,json} (default freshness)")
    args = parser.parse_args(argv)
    result = run(args.rate, args.seconds, args.interval)
    print(write_result(Path(__file__).parent / "results", args.out, result, render))
    return 0


if __name__ == "__main__":
    sys.exit(main())
