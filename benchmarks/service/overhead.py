"""Service overhead: items trained per second by the trainer service (through Kafka) divided by the same
engine on the same items and plan without Kafka, at a fixed rate below saturation (goal ≥ 0.85).

In one run, per model (``mnistnet``, ``mlp``), at R = half the saturation rate of
``results/saturation.json`` (or ``--rate MODEL=R``):
- **engine alone**: the trainer's own learner (``EngineLearner``: the same planner, plan, StreamEngine and
  EngineSettings, torch threads and flush-denormal as ``start_trainer``), fed MNIST train items 0, 1, 2, …
  (decoded from the same uint8 bytes) with ``WallClock.submit(x, y)`` paced at R on the wall clock;
  trained/s = items admitted to a worker per second (the rest are skipped ``busy``).
- **service**: ``ferret run`` as its own process on the embedded Tansu broker; ``SampleProducer`` streams the
  same items at R; trained/s = predictions read back (independent consumer) whose decision is DISPATCHED, per
  second. The stream's first second is left out of the service's rate (a fresh idempotent producer's first
  records wait ~0.5 s on Tansu and then arrive as a burst); the figure with it is in the JSON.
- **engine alone, bursty** (attribution, not the goal's baseline): the same, but each period's items submitted
  back to back at the period's end — 50 ms for ``shipped`` (the trainer loop's ``consume(256, 0.05)`` returns
  after 256 records or 50 ms) and 250 ms for ``fetch-500`` (Tansu does not answer a waiting fetch when
  records arrive: with librdkafka's 500-ms wait a Kafka hop takes 10–260 ms, evenly spread, see latency.md).
Both also report backward passes per second (the trainer's GetStatus counter / the engine's counter). The
service runs twice per model: as shipped (its consumer uses ``fetch.wait.max.ms`` 10) and with 500 ms.

The service shares the 2 cores with the broker, the producer and the reader: that is part of the overhead
measured here (the CPU columns say where the cores went).

    .venv/bin/python -m benchmarks.service.overhead                   # → results/overhead.{md,json}
    .venv/bin/python -m benchmarks.service.overhead --rate mnistnet=100 --rate mlp=200 --window-s 45
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from benchmarks.service import harness as h

COMMAND = "python -m benchmarks.service.overhead"
GOAL = 0.85
WINDOW_S = 30.0
# How the service's trainer receives its records. shipped: every <= 50 ms (the loop's consume(256,
# timeout=0.05) returns when 256 records or the 50 ms are there). fetch-500: in batches about every 250 ms
# (Tansu does not answer a waiting fetch when records arrive; latency.py's Kafka hop with a 500-ms wait
# spreads evenly over 10-260 ms).
BURSTS = {"shipped": 0.05, "fetch-500": 0.25}
EXCLUDE_FIRST_S = 1.0


def service_run(model: str, config: str, rate: float, seconds: float, dataset: Any) -> dict[str, Any]:
    with h.running_service(model, kafka_properties=h.KAFKA_CONFIGS[config]) as (service, reader, sampler):
        # the group has its partitions (readiness); give the consumer a second before the measured stream
        time.sleep(1.0)
        r = h.run_stream(
            service,
            reader,
            sampler,
            dataset,
            rate=rate,
            seconds=seconds,
            stream="overhead",
            drain_timeout=120,
            exclude_first_s=EXCLUDE_FIRST_S,
        )
        preds = reader.get("overhead")
        dispatched_all = sum(1 for p in preds if p.decision == h.DISPATCHED)
        return {
            "kafka_config": config,
            "kafka_properties": h.KAFKA_CONFIGS[config],
            "plan": service.plan,
            "stream": r.as_dict(),
            "trained_per_s": r.trained_per_s,
            "trained_per_s_incl_first_second": dispatched_all / r.seconds if r.seconds else float("nan"),
            "backward_passes_per_s": r.backward_passes_per_s,
            "busy_pct": r.busy_pct,
            "cpu": r.cpu,
            "serving_s": round(service.startup.serving_s, 2),
        }


def main() -> int:
    global WINDOW_S
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mnistnet", "mlp"])
    parser.add_argument("--rate", action="append", default=[], metavar="MODEL=R", help="override saturation/2")
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    parser.add_argument("--configs", nargs="+", default=["shipped", "fetch-500"], choices=sorted(h.KAFKA_CONFIGS))
    args = parser.parse_args()
    WINDOW_S = args.window_s

    saturation_file = h.RESULTS / "saturation.json"
    saturation = {}
    if saturation_file.exists():
        for r in json.loads(saturation_file.read_text())["results"]:
            if r["budget_bytes"] is None and r["saturation_rate"]:
                saturation[r["model"]] = r["saturation_rate"]
    rates = {m: saturation[m] / 2 for m in args.models if m in saturation}
    rates.update({k: float(v) for k, v in (item.split("=", 1) for item in args.rate)})
    missing = [m for m in args.models if m not in rates]
    if missing:
        raise SystemExit(f"no saturation rate for {missing}: run saturation.py first or give --rate MODEL=R")

    dataset = h.mnist()
    load_before = h.load_average()
    results = []
    for model in args.models:
        rate = rates[model]
        print(f"  {model}: engine alone at {rate:g}/s …", file=sys.stderr, flush=True)
        engine = h.engine_alone(model, dataset, rate, WINDOW_S)
        bursty = {}
        for config in args.configs:
            period = BURSTS[config]
            print(
                f"  {model}: engine alone at {rate:g}/s in {period * 1000:g}-ms bursts …", file=sys.stderr, flush=True
            )
            bursty[config] = h.engine_alone(model, dataset, rate, WINDOW_S, burst_period_s=period)
        for config in args.configs:
            print(f"  {model}: service ({config}) at {rate:g}/s …", file=sys.stderr, flush=True)
            service = service_run(model, config, rate, WINDOW_S, dataset)
            results.append(
                {
                    "model": model,
                    "rate": rate,
                    "kafka_config": config,
                    "same_plan": service["plan"] == engine["plan"],
                    "engine": engine,
                    "engine_bursts": bursty[config],
                    "service": service,
                    "ratio_trained_vs_bursts": service["trained_per_s"] / bursty[config]["admitted_per_s"],
                    "ratio_trained": service["trained_per_s"] / engine["admitted_per_s"],
                    "ratio_backward_passes": service["backward_passes_per_s"] / engine["backward_passes_per_s"],
                    "load_average": h.load_average(),
                }
            )
            print(f"  {model} ({config}): ratio {results[-1]['ratio_trained']:.3f}", file=sys.stderr, flush=True)
    load_after = h.load_average()

    command = COMMAND + "".join(f" --rate {r}" for r in args.rate)
    command += f" --window-s {WINDOW_S:g}" if WINDOW_S != 30.0 else ""
    if args.models != ["mnistnet", "mlp"]:
        command += f" --models {' '.join(args.models)}"
    if args.configs != ["shipped", "fetch-500"]:
        command += f" --configs {' '.join(args.configs)}"
    rows = [
        "| model | Kafka config | rate/s | plan (stages × workers) | same plan | engine alone trained/s (busy %) | service "
        "trained/s (busy %) | **ratio** (goal ≥ 0.85) | backward passes/s engine → service (ratio) | engine alone, "
        "arrivals in the service's bursts: trained/s (busy %) | service ÷ bursty engine | CPU engine alone | CPU "
        "service: trainer / broker / bench / machine |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        e, s, b = r["engine"], r["service"], r["engine_bursts"]
        cpu = s["cpu"]
        rows.append(
            f"| {r['model']} | {r['kafka_config']} | {r['rate']:g} | {e['stages']} × {e['workers']} | {'yes' if r['same_plan'] else 'NO'} | "
            f"{e['admitted_per_s']:.1f} ({e['busy_pct']:.1f}) | {s['trained_per_s']:.1f} ({s['busy_pct']:.1f}) | "
            f"**{r['ratio_trained']:.2f}** {'met' if r['ratio_trained'] >= GOAL else 'not met'} | "
            f"{e['backward_passes_per_s']:.1f} → {s['backward_passes_per_s']:.1f} ({r['ratio_backward_passes']:.2f}) | "
            f"{b['admitted_per_s']:.1f} ({b['busy_pct']:.1f}) in {b['burst_period_s'] * 1000:g}-ms bursts | "
            f"{r['ratio_trained_vs_bursts']:.2f} | {e['cpu_cores']:.2f} | {cpu.get('trainer', float('nan')):.2f} / "
            f"{cpu.get('broker', float('nan')):.2f} / {cpu.get('benchmark', float('nan')):.2f} / "
            f"{cpu.get('machine_busy', float('nan')):.2f} |"
        )
    text = [
        "# Service overhead: trained items per second, service ÷ engine alone (MNIST)",
        "",
        f"Command: `{command}` — {h.machine()['cpus']} CPUs, torch {h.machine()['torch']}; {WINDOW_S:g}-s windows; "
        f"rates = half of `results/saturation.json` ({saturation or 'not found'}); trainer = `ferret run` as a "
        f"separate process, Kafka client settings {'; '.join(f'{c}: {h.CONFIG_NOTES[c]}' for c in args.configs)}; "
        "periodic snapshots off. Load "
        f"average (1/5/15 min) {load_before} before, {load_after} after.",
        "",
        "trained/s = items admitted to a pipeline worker per second (service: predictions read back whose decision "
        "is DISPATCHED, the stream's first second left out; engine: `WallClock.submit` arrivals not skipped). Same "
        "plan = the service's GetPlan equals the engine's `Plan.to_dict()`. CPU in cores (1.0 = one core busy) "
        "over the window: the engine alone has the machine to itself; the service shares it with the broker, "
        "the producer and the reader (in the benchmark process). *Arrivals in the service's bursts*: the same engine, "
        "items, rate and plan, but each period's items submitted back to back at its end — 50 ms for `shipped` "
        "(the trainer loop's `consume(256, timeout=0.05)` returns after 256 records or 50 ms) and 250 ms for "
        "`fetch-500` (Tansu does not answer a waiting fetch when records arrive: with a 500-ms wait a Kafka hop "
        "takes 10–260 ms, evenly spread, see latency.md): the part of the gap that the arrival pattern alone "
        "explains, without Kafka.",
        "",
        *rows,
        "",
    ]
    payload = {
        "command": command,
        "git_head": h.git_head(),
        "configs": {c: h.CONFIG_NOTES[c] for c in args.configs},
        "machine": h.machine(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "goal": GOAL,
        "window_s": WINDOW_S,
        "rates": rates,
        "saturation": saturation,
        "results": results,
    }
    markdown = "\n".join(text)
    h.write_results("overhead", payload, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
