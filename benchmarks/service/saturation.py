"""Saturation rate of the trainer service: the highest producer rate at which predictions keep up
(prediction lag bounded over a 60-s window, DESIGN §4), for ``mnistnet`` and ``mlp`` on MNIST.

The trainer runs as its own process (``ferret run``, configured by FERRET_* variables) against the embedded
local stack (Tansu + Valkey); this script produces MNIST items (784-byte uint8 ``ferret.v1.Sample``) with
:class:`services.producer.stream.SampleProducer` at a paced rate and reads every prediction back with an
independent consumer (fresh group, from the beginning; distinct sample ids). Each rate is its own stream
(``stream`` name = step), so its predictions are told apart.

Method, per model (every window on a fresh stack and trainer: Tansu's CPU per fetch grows with the
records it holds, so a window must not inherit the previous windows' records):
1. start-up: on the first stack, 8 s at 20 items/s right after the trainer reports SERVING (kept apart);
2. coarse search: 15-s windows at geometric rates (×1.5) until the first window whose lag is not bounded;
3. confirmation: 60-s windows, first at the geometric mean of the last bounded and the first unbounded
   coarse rate, then (while unbounded) at the last bounded coarse rate and below (at most 3 windows).
The saturation rate is the highest rate bounded over a 60-s window. Kafka client settings: ``shipped``
(the trainer as committed; its consumer uses ``fetch.wait.max.ms`` 10) unless ``--kafka fetch-500``
(librdkafka's 500 ms through ``kafka.properties``, what the trainer used before commit 37aa77e).

Bounded: every item's prediction is read back within the drain time, and the median latency of the
window's last quarter ≤ max(2 × the first quarter's median, first quarter + 50 ms) and < 1 s. Latency is
the Prediction's ``latency_ms`` (the trainer's publish time − the sample's event time). The first second of
every stream is left out of the latency and rate figures (a fresh idempotent producer's first records wait
~0.5 s on Tansu before they are even sent) and reported apart in the JSON.

    .venv/bin/python -m benchmarks.service.saturation                      # → results/saturation.{md,json}
    .venv/bin/python -m benchmarks.service.saturation --models mnistnet --budget 32MiB --out saturation-budget
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from benchmarks.service import harness as h
from services.cli.args import budget_type

COMMAND = "python -m benchmarks.service.saturation"
START = {"mnistnet": 50.0, "mlp": 100.0}
RATIO = 1.5
COARSE_S = 15.0
CONFIRM_S = 60.0
EXCLUDE_FIRST_S = 1.0


def bounded(r: h.StreamResult) -> tuple[bool, str]:
    if not r.complete:
        return False, f"backlog: {r.predicted + r.extra['excluded_items']}/{r.produced} read back in time"
    q1, q4 = r.q1_median_ms, r.q4_median_ms
    if not q4 < 1000:
        return False, f"q4 median {q4:.0f} ms ≥ 1 s"
    if q4 > max(2 * q1, q1 + 50):
        return False, f"q4 median {q4:.0f} ms > max(2×q1, q1+50) = {max(2 * q1, q1 + 50):.0f} ms"
    return True, "bounded"


def settle(reader: h.PredictionReader, r: h.StreamResult, timeout: float = 240.0) -> float:
    """Wait until the stream's backlog is predicted (so the next window starts clean); seconds waited."""
    began = time.monotonic()
    reader.wait_for(r.stream, r.produced, timeout)
    return time.monotonic() - began


def search(model: str, budget: int | None, kafka: str, dataset: Any) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    props = h.KAFKA_CONFIGS[kafka]
    startup: dict[str, Any] = {}

    def window(rate: float, seconds: float, phase: str) -> tuple[bool, h.StreamResult]:
        """One window on a fresh stack and trainer (Tansu's fetch cost grows with the records it holds, so
        every window starts from an empty broker)."""
        with h.running_service(model, kafka_properties=props, budget_bytes=budget) as (service, reader, sampler):
            if not startup:
                warm = h.warm_up(service, reader, sampler, dataset, 20.0, 8.0)
                settle(reader, warm)
                startup.update(
                    serving_s=round(service.startup.serving_s, 2),
                    first_prediction_after_serving_s=round(service.startup.first_prediction_after_serving_s, 2),
                    warmup=warm.as_dict(),
                    plan={k: service.plan.get(k) for k in ("stages", "num_workers", "live_workers", "planned_bytes")},
                )
            else:
                time.sleep(1.0)  # the consumer has its partition (readiness); let it issue its first fetch
            r = h.run_stream(
                service,
                reader,
                sampler,
                dataset,
                rate=rate,
                seconds=seconds,
                stream=f"{phase}-{len(steps)}",
                drain_timeout=60,
                exclude_first_s=EXCLUDE_FIRST_S,
            )
            ok, why = bounded(r)
            waited = settle(reader, r, timeout=120) if not r.complete else 0.0
            serving = round(service.startup.serving_s, 2)
        row = {
            "phase": phase,
            "window_s": seconds,
            "bounded": ok,
            "verdict": why,
            "extra_drain_s": round(waited, 1),
            "serving_s": serving,
        }
        row.update(r.as_dict())
        steps.append(row)
        print(
            f"  {model} {phase:7} {rate:7.0f}/s: {r.predicted_per_s:6.1f} predicted/s, {r.trained_per_s:5.1f} trained/s, "
            f"busy {r.busy_pct:4.1f} %, p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms, q1→q4 {r.q1_median_ms:.0f}→"
            f"{r.q4_median_ms:.0f} ms, CPU {r.cpu}: {why}",
            file=sys.stderr,
            flush=True,
        )
        return ok, r

    began = time.monotonic()
    # coarse
    rate, last_ok, first_fail = START[model], None, None
    while rate < 20_000:
        ok, _ = window(rate, COARSE_S, "coarse")
        if ok:
            last_ok = rate
            rate = round(rate * RATIO)
        else:
            first_fail = rate
            break
    # confirm over 60 s
    saturation = None
    if last_ok is None:
        assert first_fail is not None
        candidates = [round(first_fail / RATIO), round(first_fail / RATIO**2), round(first_fail / RATIO**3)]
    elif first_fail is None:
        candidates = [last_ok]
    else:
        candidates = [round(math.sqrt(last_ok * first_fail)), last_ok, round(last_ok / RATIO)]
    for rate in candidates:
        ok, _ = window(rate, CONFIRM_S, "confirm")
        if ok:
            saturation = rate
            break
    confirm_fail = [s["rate"] for s in steps if s["phase"] == "confirm" and not s["bounded"]]
    return {
        "model": model,
        "budget_bytes": budget,
        "kafka_config": kafka,
        "kafka_properties": props,
        "plan": startup.get("plan", {}),
        "startup": startup,
        "saturation_rate": saturation,
        "lowest_unbounded_rate": min([*confirm_fail, *([first_fail] if first_fail else [])], default=None),
        "steps": steps,
        "seconds": round(time.monotonic() - began, 1),
    }


def table(result: dict[str, Any]) -> list[str]:
    rows = [
        "| phase | rate/s | window | predicted/s | trained/s | busy % | p50 ms | p99 ms | q1→q4 median ms | "
        "growth ms/s | max lag s | first s: items, median / max ms | CPU trainer / broker / machine / steal | "
        "verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["steps"]:
        cpu = s["cpu"]
        rows.append(
            f"| {s['phase']} | {s['rate']:,.0f} | {s['window_s']:.0f} s | {h.fmt(s['predicted_per_s'])} | "
            f"{h.fmt(s['trained_per_s'])} | {h.fmt(s['busy_pct'])} | {h.fmt(s['p50_ms'], 0)} | {h.fmt(s['p99_ms'], 0)} | "
            f"{h.fmt(s['q1_median_ms'], 0)} → {h.fmt(s['q4_median_ms'], 0)} | {h.fmt(s['growth_ms_per_s'])} | "
            f"{h.fmt(s['max_lag_s'], 2)} | {s['extra']['excluded_items']}, {h.fmt(s['extra']['excluded_p50_ms'], 0)} / "
            f"{h.fmt(s['extra']['excluded_max_ms'], 0)} | {cpu.get('trainer', math.nan):.2f} / {cpu.get('broker', math.nan):.2f} / "
            f"{cpu.get('machine_busy', math.nan):.2f} / {cpu.get('steal', math.nan):.2f} | "
            f"{'**bounded**' if s['bounded'] else s['verdict']} |"
        )
    return rows


def render(payload: dict[str, Any]) -> str:
    results, method = payload["results"], payload["method"]
    summary = [
        "| model | plan (stages × workers) | budget | saturation rate (60 s bounded) | lowest unbounded rate | "
        "SERVING after | first prediction after SERVING | warm-up stream p99 / max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        plan = r["plan"]
        budget = "unconstrained" if r["budget_bytes"] is None else f"{r['budget_bytes']:,} B"
        warm = r["startup"]["warmup"]
        summary.append(
            f"| {r['model']} | {len(plan['stages'] or [])} × {plan['num_workers']} | {budget} | "
            f"**{h.fmt(r['saturation_rate'], 0)} items/s** | {h.fmt(r['lowest_unbounded_rate'], 0)} items/s | "
            f"{r['startup']['serving_s']:.1f} s | {r['startup']['first_prediction_after_serving_s']:.2f} s | "
            f"{h.fmt(warm['p99_ms'], 0)} / {h.fmt(warm['max_ms'], 0)} |"
        )
    kafka = results[0]["kafka_config"] if results else "shipped"
    text = [
        "# Saturation rate of the trainer service (MNIST)",
        "",
        f"Command: `{payload['command']}` — {payload['machine']['cpus']} CPUs, torch {payload['machine']['torch']}; "
        "trainer = `ferret run` as a separate process; broker = embedded Tansu on the same machine; Kafka client "
        f"settings: {kafka} — {payload.get('kafka_note') or h.CONFIG_NOTES.get(kafka, '')}; periodic snapshots off. Load average (1/5/15 min) "
        f"{payload['load_average_before']} before, {payload['load_average_after']} after; each window's own is in "
        "the JSON.",
        "",
        "Saturation rate = the highest producer rate whose prediction lag stays bounded over a 60-s window "
        "(all items predicted; last-quarter median latency ≤ max(2 × first quarter, first quarter + 50 ms) "
        f"and < 1 s). Every window runs on a fresh broker and trainer. Coarse {method['coarse_window_s']:g}-s windows "
        f"at ×{method['ratio']:g} rates find the bracket; {method['confirm_window_s']:g}-s windows confirm. Latency "
        "and rate columns leave out each stream's first second (a fresh idempotent producer's first records wait "
        "~0.5 s on Tansu before they are sent): the *first s* column shows those items (count, median / max "
        "latency). trained/s = predictions whose decision is DISPATCHED; busy % = SKIPPED_BUSY; growth = "
        "least-squares slope of latency over event time; max lag = the trainer's own `lag_seconds` (GetStatus, "
        "sampled every second); CPU in cores: the trainer process, the broker, the whole VM, and steal (time "
        "the hypervisor gave elsewhere).",
        "",
        *summary,
        "",
    ]
    for r in results:
        text += [f"## {r['model']} ({r['seconds']:.0f} s)", "", *table(r), ""]
    return "\n".join(text)


def main() -> int:
    global COARSE_S, CONFIRM_S
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mnistnet", "mlp"], choices=sorted(START))
    parser.add_argument("--budget", type=budget_type, default=None, help="memory budget (default: unconstrained)")
    parser.add_argument("--kafka", choices=sorted(h.KAFKA_CONFIGS), default="shipped")
    parser.add_argument("--out", default="saturation", help="results/<out>.{md,json}")
    parser.add_argument("--coarse-s", type=float, default=COARSE_S, help="coarse window (s)")
    parser.add_argument("--confirm-s", type=float, default=CONFIRM_S, help="confirmation window (s); DESIGN: 60")
    parser.add_argument("--render-only", action="store_true", help="rewrite results/<out>.md from its JSON")
    args = parser.parse_args()
    COARSE_S, CONFIRM_S = args.coarse_s, args.confirm_s
    if args.render_only:
        payload = json.loads((h.RESULTS / f"{args.out}.json").read_text())
        markdown = render(payload)
        (h.RESULTS / f"{args.out}.md").write_text(markdown, encoding="utf-8")
        print(markdown)
        return 0

    dataset = h.mnist()
    load_before = h.load_average()
    results = [search(model, args.budget, args.kafka, dataset) for model in args.models]
    load_after = h.load_average()
    command = f"{COMMAND}" + (f" --models {' '.join(args.models)}" if args.models != ["mnistnet", "mlp"] else "")
    command += f" --budget {args.budget}" if args.budget is not None else ""
    command += f" --kafka {args.kafka}" if args.kafka != "shipped" else ""
    command += f" --out {args.out}" if args.out != "saturation" else ""
    command += f" --coarse-s {COARSE_S:g}" if COARSE_S != 15.0 else ""
    command += f" --confirm-s {CONFIRM_S:g}" if CONFIRM_S != 60.0 else ""
    payload = {
        "command": command,
        "kafka_note": h.CONFIG_NOTES[args.kafka],
        "git_head": h.git_head(),
        "machine": h.machine(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "method": {
            "start_rates": START,
            "ratio": RATIO,
            "coarse_window_s": COARSE_S,
            "confirm_window_s": CONFIRM_S,
            "excluded_first_s_per_stream": EXCLUDE_FIRST_S,
            "trainer": "separate process: python -m services.cli.main run",
            "fresh_stack_per_window": True,
        },
        "results": results,
    }
    markdown = render(payload)
    h.write_results(args.out, payload, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
