"""Where a stall of the live stream goes (issue 7k (A)): short runs of the plain loop on one local broker,
each item's times stamped along its hop, and the machine's CPU beside them.

Per run (its own topics on one embedded Tansu broker, as ``side_by_side.py`` runs them): the plain loop
(``plain_loop.py --trace``), 100 unlabelled warm-up items, 1 s to settle, then ``--items`` at ``--rate``
from a fresh ``SampleProducer`` whose delivery reports are timed. Per item: its event time (the producer's
stamp, just before ``produce``), the delivery report (the producer's ack; served by the producer's own
``poll``), the broker's append time (the samples topic is created with
``message.timestamp.type=LogAppendTime``; the consumer sees the type, so the table says whether the broker
honoured it), the loop's receipt (``poll`` returned it) and publish time; every GC of the loop's process
(``gc.callbacks``); and every 50 ms the CPU of the machine, the broker, the loop and this process (the
producer), and the hypervisor's steal. A run *stalls* when some item's event → publish exceeds
``--stall-ms``; for the worst item the table splits its latency into the hops, and gives the longest gap
of each timeline and the CPU over the stall.

    .venv/bin/python -m benchmarks.live.stall_probe --runs 10        # → results/stall_probe.{md,json}
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.service import harness as h
from ferret_core.data import Dataset, load_dataset
from services.config import ProducerSettings, load_settings
from services.config.data_root import default_data_root
from services.kafka.admin import ensure_topics
from services.kafka.record_codec import now_ms
from services.localstack import LocalStack
from services.producer import SampleProducer
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.stream import CONSUMER_DEFAULTS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

RESULTS = HERE / "results"
WARMUP_ITEMS = 100
SETTLE_S = 1.0
TICK = os.sysconf("SC_CLK_TCK")


class TimedProducer(SampleProducer):
    """``SampleProducer`` that notes each sample's delivery report: sequence → (wall ms when the report was
    served, the acked record's timestamp type and ms). ``wait_ready=False``: the stream starts without
    waiting for the producer id, as ``SampleProducer`` did before issue 7i (then only the rate header's
    ``list_topics`` came before the first record), which is how the committed side-by-side ran."""

    def __init__(self, *args: Any, wait_ready: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delivered_at: dict[int, tuple[int, int, int]] = {}
        self._wait_ready = wait_ready

    def _wait_until_ready(self, client: Any, readiness: Any, began: float) -> Any:
        return super()._wait_until_ready(client, readiness, began) if self._wait_ready else None

    def _on_sample(self, err: KafkaError | None, msg: Message) -> None:
        super()._on_sample(err, msg)
        if err is None:
            kind, stamp = msg.timestamp()
            self.delivered_at[messages_pb2.Sample.FromString(msg.value()).sequence] = (now_ms(), kind, stamp)


def _jiffies(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


class CpuTimeline:
    """Every ``interval`` s: wall ms and the jiffies of the machine (busy, steal) and of each named pid."""

    def __init__(self, pids: dict[str, int | None], interval: float = 0.05) -> None:
        self.pids, self.interval = pids, interval
        self.rows: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            idle, steal = fields[3] + fields[4], fields[7]
            row = {"ms": now_ms(), "busy": sum(fields[:8]) - idle - steal, "steal": steal}
            row.update({name: _jiffies(pid) for name, pid in self.pids.items()})
            self.rows.append(row)

    def close(self) -> list[dict[str, int]]:
        self._stop.set()
        self._thread.join()
        return self.rows

    @staticmethod
    def cores(rows: list[dict[str, int]], start_ms: int, end_ms: int) -> dict[str, float]:
        """Cores used by each column between the samples nearest ``start_ms`` and ``end_ms``."""
        inside = [r for r in rows if start_ms - 60 <= r["ms"] <= end_ms + 60]
        if len(inside) < 2:
            return {}
        a, b = inside[0], inside[-1]
        span = (b["ms"] - a["ms"]) / 1000
        out = {k: (b[k] - a[k]) / TICK / span for k in a if k != "ms"}
        out["others"] = out["busy"] - sum(v for k, v in out.items() if k not in ("busy", "steal"))
        return {k: round(v, 2) for k, v in out.items()}


class Witness:
    """An independent consumer of the samples topic on a thread of this process (the plain loop's consumer
    settings, its own client): sequence → wall ms when it received the record. If it receives a late block
    when the loop does, the delay is upstream of both consumers (producer or broker)."""

    def __init__(self, bootstrap: str, topic: str, stream: str) -> None:
        self.received: dict[int, int] = {}
        self._stream = stream
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"witness-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                **CONSUMER_DEFAULTS,
            }
        )
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.1)
            if message is None or message.error():
                continue
            at = now_ms()
            sample = messages_pb2.Sample.FromString(message.value())
            if sample.stream == self._stream:
                self.received[sample.sequence] = at

    def close(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join()
        self._consumer.close()
        return self.received


def create_topics(bootstrap: str, prefix: str, append_time: bool) -> None:
    """The samples topic with ``message.timestamp.type=LogAppendTime`` (when asked), the rest as usual."""
    samples = f"{prefix}.samples"
    config = {"message.timestamp.type": "LogAppendTime"} if append_time else {}
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the result is in
    futures = admin.create_topics(
        [NewTopic(samples, num_partitions=1, replication_factor=1, config=config)], operation_timeout=15
    )
    futures[samples].result(timeout=15)
    ensure_topics(bootstrap, prefix)


def one_run(stack: LocalStack, dataset: Dataset, args: argparse.Namespace, index: int) -> dict[str, Any]:
    prefix = f"stall-{uuid.uuid4().hex[:6]}"
    create_topics(stack.bootstrap_servers, prefix, not args.create_time)
    settings = load_settings(
        None, env={"FERRET_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "FERRET_KAFKA_TOPIC_PREFIX": prefix}
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.live.plain_loop",
            "--dataset",
            args.dataset,
            "--model",
            args.model,
            "--bootstrap",
            stack.bootstrap_servers,
            "--prefix",
            prefix,
            "--items",
            str(args.items + WARMUP_ITEMS),
            "--trace",
        ],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "READY":
        raise RuntimeError("the plain loop did not start")
    warm = ProducerSettings(rate=args.rate, items=WARMUP_ITEMS, stream=f"w{index}", labels="none")
    SampleProducer(dataset, settings.kafka, warm, create_topics=False).run()
    time.sleep(SETTLE_S)
    witness = Witness(stack.bootstrap_servers, settings.kafka.topics.samples, f"s{index}")
    time.sleep(0.5)  # its assignment is in place before the stream
    cpu = CpuTimeline({"broker": stack.broker.pid if stack.broker else None, "loop": proc.pid, "producer": os.getpid()})
    producer = TimedProducer(
        dataset,
        settings.kafka,
        ProducerSettings(rate=args.rate, items=args.items, stream=f"s{index}", shuffle=index > 0, seed=index),
        create_topics=False,
        wait_ready=not args.no_ready_wait,
    )
    began = now_ms()
    report = producer.run()
    out, _ = proc.communicate(timeout=120)
    timeline = cpu.close()
    witnessed = witness.close()
    result = json.loads(out.strip().splitlines()[-1])
    trace = result["trace"]
    warm_sequences = WARMUP_ITEMS  # the loop saw the warm-up first: its items are the first in the trace
    items = []
    for seq, event, kind, stamp, received, published in trace["items"][warm_sequences:]:
        dr = producer.delivered_at.get(seq)
        items.append(
            {
                "seq": seq,
                "event": event,
                "append": stamp if kind == 2 else None,
                "ts_type": kind,
                "dr": dr[0] if dr else None,
                "witness": witnessed.get(seq),
                "received": received,
                "published": published,
            }
        )
    began = min((i["event"] for i in items), default=began)  # the stream's clock: its first event time
    return {
        "run": index,
        "prefix": prefix,
        "produced": report.produced,
        "ready_s": report.ready_s,
        "began_ms": began,
        "items": items,
        "gc": [g for g in trace["gc"] if g[0] >= began - 100],
        "cpu": timeline,
        "load_average": h.load_average(),
    }


def _gaps(times: list[int | None], began: int) -> dict[str, float] | None:
    """The longest gap between consecutive (sorted) times and when it started (ms after ``began``)."""
    ts = sorted(t for t in times if t is not None)
    if len(ts) < 2:
        return None
    gap, at = max((b - a, a) for a, b in itertools.pairwise(ts))
    return {"gap_ms": gap, "at_ms": at - began}


def analyse(run: dict[str, Any], stall_ms: float) -> dict[str, Any]:
    items, began = run["items"], run["began_ms"]
    worst = max(items, key=lambda i: i["published"] - i["event"])
    latency = worst["published"] - worst["event"]
    split = {
        "event→ack": None if worst["dr"] is None else worst["dr"] - worst["event"],
        "event→append": None if worst["append"] is None else worst["append"] - worst["event"],
        "append→receipt": None if worst["append"] is None else worst["received"] - worst["append"],
        "ack→receipt": None if worst["dr"] is None else worst["received"] - worst["dr"],
        "event→witness": None if worst["witness"] is None else worst["witness"] - worst["event"],
        "receipt→published": worst["published"] - worst["received"],
    }
    gaps = {
        name: _gaps([i[key] for i in items], began)
        for name, key in (
            ("event", "event"),
            ("ack", "dr"),
            ("append", "append"),
            ("witness", "witness"),
            ("receipt", "received"),
        )
    }
    late = [i for i in items if i["published"] - i["event"] > stall_ms]
    window = (min(i["event"] for i in late), max(i["published"] for i in late)) if late else None
    gc_in = [g for g in run["gc"] if window and window[0] <= g[0] <= window[1]]
    lat = sorted(i["published"] - i["event"] for i in items)
    return {
        "run": run["run"],
        "stalled": bool(late),
        "late_items": len(late),
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "worst_ms": latency,
        "worst_seq": worst["seq"],
        "worst_at_ms": worst["event"] - began,
        "split_ms": split,
        "gaps": gaps,
        "ts_type": worst["ts_type"],
        "stall_window_ms": None if window is None else [window[0] - began, window[1] - began],
        "cpu_in_stall": CpuTimeline.cores(run["cpu"], *window) if window else None,
        "cpu_whole_run": CpuTimeline.cores(run["cpu"], run["cpu"][0]["ms"], run["cpu"][-1]["ms"])
        if run["cpu"]
        else None,
        "gc_in_stall_ms": round(sum(g[1] for g in gc_in), 1),
        "gc_max_ms": max((g[1] for g in run["gc"]), default=0.0),
    }


def render(payload: dict[str, Any]) -> str:
    rows = payload["analysis"]
    kinds = sorted({i["ts_type"] for r in payload["runs"] for i in r["items"]})
    seen = ", ".join({1: "CreateTime", 2: "LogAppendTime"}.get(k, str(k)) for k in kinds)
    stalled = [r for r in rows if r["stalled"]]

    def gap(r: dict[str, Any], name: str) -> str:
        g = r["gaps"][name]
        return "—" if g is None else f"{g['gap_ms']} @{g['at_ms']}"

    def ms(v: float | None) -> str:
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.0f}"

    out = [
        f"# Stall probe: {payload['dataset']}/{payload['model']}, {payload['items']} items at {payload['rate']:.0f}/s, "
        f"{len(rows)} runs on one broker",
        "",
        f"Command: `{payload['command']}` at {payload['commit']}. Load average {payload['load_before']} before, "
        f"{payload['load_after']} after; {payload['seconds']:.0f} s. Samples topic timestamps: "
        f"{payload['timestamps']}, the consumer saw {seen}. The measured stream's producer "
        f"{'waits' if payload.get('producer_waits_for_id', True) else 'does **not** wait'} for its producer id. "
        f"A run stalls when an item's event → publish exceeds {payload['stall_ms']:.0f} ms: "
        f"**{len(stalled)} of {len(rows)} runs**.",
        "",
        "Worst item per run, its latency split along the hop (ms): event → ack (the producer's delivery report), "
        "ack → receipt (the loop's `poll` returned it), event → witness (an independent consumer on a thread of the "
        "producer's process received it), receipt → published (predict + SGD of the items before it). Longest gap "
        "of each timeline, ms @ ms after the stream's start. CPU over the stall (cores: machine busy, broker, loop, "
        "producer = this process, others = busy − the three, steal). GC: the loop's collections inside the stall "
        "(sum) and its longest anywhere.",
        "",
        "| run | p99 | worst (item @ms) | event→ack | ack→receipt | event→witness | receipt→published | gap event | "
        "gap ack | gap witness | gap receipt | CPU in stall: busy / broker / loop / producer / others / steal | GC in "
        "stall / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["split_ms"]
        c = r["cpu_in_stall"]
        cpu = (
            "—"
            if not c
            else " / ".join(f"{c.get(k, 0):.2f}" for k in ("busy", "broker", "loop", "producer", "others", "steal"))
        )
        out.append(
            f"| {r['run']} | {r['p99_ms']} | {r['worst_ms']} (#{r['worst_seq']} @{r['worst_at_ms']}) | "
            f"{ms(s['event→ack'])} | {ms(s['ack→receipt'])} | {ms(s['event→witness'])} | "
            f"{ms(s['receipt→published'])} | "
            f"{gap(r, 'event')} | {gap(r, 'ack')} | {gap(r, 'witness')} | {gap(r, 'receipt')} | {cpu} | "
            f"{r['gc_in_stall_ms']} / {r['gc_max_ms']} |"
        )
    notes = payload.get("notes", [])
    if notes:
        out += ["", "## Reading", "", *(f"- {n}" for n in notes)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="mnistnet")
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--rate", type=float, default=130.0, help="items/s (0.5× of MNISTNet's plain-loop saturation)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--stall-ms", type=float, default=200.0)
    parser.add_argument("--create-time", action="store_true", help="leave the samples topic at CreateTime")
    parser.add_argument("--no-ready-wait", action="store_true", help="the producer as before issue 7i (TimedProducer)")
    parser.add_argument("--out", default="stall_probe")
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args(argv)
    if args.render_only:
        payload = json.loads((RESULTS / f"{args.out}.json").read_text())
    else:
        t0, load_before = time.monotonic(), h.load_average()
        dataset = load_dataset(args.dataset, default_data_root())
        stack = LocalStack().start()
        runs = []
        try:
            for i in range(args.runs):
                runs.append(one_run(stack, dataset, args, i))
                a = analyse(runs[-1], args.stall_ms)
                print(json.dumps({k: v for k, v in a.items() if k != "gaps"}), flush=True)
        finally:
            stack.stop()
        payload = {
            "dataset": args.dataset,
            "model": args.model,
            "items": args.items,
            "rate": args.rate,
            "stall_ms": args.stall_ms,
            "producer_waits_for_id": not args.no_ready_wait,
            "timestamps": "CreateTime" if args.create_time else "LogAppendTime asked",
            "command": "python -m benchmarks.live.stall_probe " + " ".join(sys.argv[1:] if argv is None else argv),
            "commit": h.git_head(),
            "load_before": load_before,
            "load_after": h.load_average(),
            "seconds": time.monotonic() - t0,
            "runs": runs,
            "analysis": [analyse(r, args.stall_ms) for r in runs],
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{args.out}.json").write_text(json.dumps(payload) + "\n")
    (RESULTS / f"{args.out}.md").write_text(render(payload))
    print(render(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
