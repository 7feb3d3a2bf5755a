"""``ferret export``: a trainer's snapshot (from Redis) as safetensors weights plus a JSON manifest."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from services.cli.args import positive_int
from services.cli.logs import add_logging_arguments, configure_logging
from services.config import load_settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a trainer's snapshot (newest by default) as safetensors weights + a JSON manifest",
        description=(
            "Read a snapshot version of a trainer replica from its Redis snapshot store (verified as a restore "
            "verifies it: checksums, the signature with redis.hmac_key) and write OUT/model.safetensors and "
            "OUT/manifest.json (model spec, input shape, classes, plan, model version, stream offsets, sha256). "
            "Load it anywhere with services.serving.export_files.load_export(OUT). To export what a running "
            "trainer holds now, take a snapshot first: ferret control snapshot."
        ),
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML settings file (default $FERRET_CONFIG)")
    parser.add_argument("--out", type=Path, required=True, help="directory to write (created if missing)")
    parser.add_argument(
        "--version", type=positive_int, default=None, dest="snapshot_version",
        help="snapshot version (default: the newest valid one)",
    )  # fmt: skip
    parser.add_argument("--redis-url", default=None, metavar="URL", help="snapshot store (default: redis.url)")
    parser.add_argument(
        "--instance-id", default=None, help="trainer replica (default: kafka.instance_id, else the host name)"
    )
    parser.add_argument(
        "--onnx", action="store_true", help="also write OUT/model.onnx (needs the onnx and onnxscript packages)"
    )
    add_logging_arguments(parser, level="WARNING")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    settings = load_settings(args.config)
    if args.redis_url is not None:
        settings = dataclasses.replace(settings, redis=dataclasses.replace(settings.redis, url=args.redis_url))
    from services.serving.exporter import export_snapshot
    from services.snapshots import SnapshotStore, redis_client, signing_key
    from services.trainer.runner import model_card

    r = settings.redis
    instance = args.instance_id or settings.kafka.resolved_instance_id()
    client = redis_client(r.url, socket_timeout_s=r.timeout_s)
    try:
        store = SnapshotStore(client, r.namespace, instance, hmac_key=signing_key(r))
        result = export_snapshot(
            store, args.out, version=args.snapshot_version, fallback_card=model_card(settings), onnx=args.onnx
        )
    finally:
        client.close()
    m = result.manifest
    print(
        json.dumps(
            {
                "out": str(result.directory),
                "snapshot_version": m.snapshot_version,
                "model_version": m.model_version,
                "model": m.card.model,
                "weights_bytes": m.weights_bytes,
                "sha256": m.sha256,
            }
        )
    )
    return 0
