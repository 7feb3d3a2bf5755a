"""``ferret export``: a trainer's snapshot (from Redis) as safetensors weights plus a JSON manifest, and
optionally a ``torch.export`` program. ``--from-trainer HOST:PORT`` first asks a running trainer's control
plane for a snapshot (``SaveSnapshot``) and exports exactly that version."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from services.cli.args import existing_file, positive_float, positive_int
from services.cli.control_cmd import TOKEN_ENV
from services.cli.logs import add_logging_arguments, configure_logging
from services.config import load_settings

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a trainer's snapshot (newest by default) as safetensors weights + a JSON manifest",
        description=(
            "Read a snapshot version of a trainer replica from its Redis snapshot store (verified as a restore "
            "verifies it: checksums, the signature with redis.hmac_key) and write OUT/model.safetensors and "
            "OUT/manifest.json (model spec, input shape, classes, plan, model version, stream offsets, sha256, "
            "the files written). Load it anywhere with services.serving.export_files.load_export(OUT). "
            "--from-trainer HOST:PORT exports what a running trainer holds now: it asks the trainer's control "
            "plane for a snapshot (SaveSnapshot, with --token / --tls-ca as `ferret control` takes them) and "
            "exports exactly that version from the same Redis. --torch-export also writes OUT/model.pt2, the "
            "model as a torch.export program that torch.export.load(path).module() runs without Ferret's code; "
            "a model torch.export refuses fails the command, naming the model and torch's reason, and nothing "
            "is written (export again without --torch-export)."
        ),
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML settings file (default $FERRET_CONFIG)")
    parser.add_argument("--out", type=Path, required=True, help="directory to write (created if missing)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--version", type=positive_int, default=None, dest="snapshot_version",
        help="snapshot version (default: the newest valid one)",
    )  # fmt: skip
    source.add_argument(
        "--from-trainer", default=None, metavar="HOST:PORT",
        help="a running trainer's control plane: take a snapshot there now and export that version "
        "(default: none, read Redis only)",
    )  # fmt: skip
    parser.add_argument("--redis-url", default=None, metavar="URL", help="snapshot store (default: redis.url)")
    parser.add_argument(
        "--instance-id", default=None, help="trainer replica (default: kafka.instance_id, else the host name)"
    )
    parser.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV),
        help=f"with --from-trainer: the control plane's bearer token (default ${TOKEN_ENV})",
    )  # fmt: skip
    parser.add_argument(
        "--tls-ca", type=existing_file, default=None,
        help="with --from-trainer: PEM CA file, connect with TLS (default: plaintext)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=positive_float, default=60.0,
        help="with --from-trainer: seconds for the snapshot call (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--torch-export", action="store_true",
        help="also write OUT/model.pt2: the model as a torch.export ExportedProgram (batch dimension dynamic)",
    )  # fmt: skip
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
    from services.serving.errors import ExportError
    from services.serving.exporter import export_snapshot
    from services.snapshots import SnapshotNotFoundError, SnapshotStore, redis_client, signing_key
    from services.trainer.runner import model_card

    r = settings.redis
    instance = args.instance_id or settings.kafka.resolved_instance_id()
    version = args.snapshot_version
    if args.tls_ca is not None and args.from_trainer is None:
        print("ferret export: --tls-ca is for the control plane of --from-trainer HOST:PORT; pass both, or neither",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if args.from_trainer is not None:
        taken = trainer_snapshot(args)
        if taken is None:
            return EXIT_FAILURE
        version, trainer_instance = taken
        if args.instance_id is not None and trainer_instance and args.instance_id != trainer_instance:
            print(
                f"ferret export: --instance-id {args.instance_id!r}, but the trainer at {args.from_trainer} is "
                f"{trainer_instance!r}: drop --instance-id (the trainer's is used)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        instance = trainer_instance or instance
    client = redis_client(r.url, socket_timeout_s=r.timeout_s)
    try:
        store = SnapshotStore(client, r.namespace, instance, hmac_key=signing_key(r))
        result = export_snapshot(
            store,
            args.out,
            version=version,
            fallback_card=model_card(settings),
            onnx=args.onnx,
            torch_export=args.torch_export,
        )
    except SnapshotNotFoundError as exc:
        if args.from_trainer is None:
            raise
        raise ExportError(
            f"the trainer at {args.from_trainer} wrote snapshot v{version} of {instance!r}, but {exc}: export reads "
            f"namespace {r.namespace!r} of the Redis in redis.url; pass the trainer's --config or --redis-url"
        ) from exc
    finally:
        client.close()
    m = result.manifest
    print(
        json.dumps(
            {
                "out": str(result.directory),
                "snapshot_version": m.snapshot_version,
                "model_version": m.model_version,
                "model_lineage": m.model_lineage,
                "model": m.card.model,
                "weights_bytes": m.weights_bytes,
                "sha256": m.sha256,
                "files": m.files,
            }
        )
    )
    return EXIT_OK


def trainer_snapshot(args: argparse.Namespace) -> tuple[int, str] | None:
    """Ask the trainer at ``--from-trainer`` for a snapshot now: its version and the trainer's instance id,
    or None after printing why the call failed (as ``ferret control`` prints it)."""
    from services.control.client import ControlCallError, ControlClient

    try:
        with ControlClient(args.from_trainer, token=args.token, tls_ca=args.tls_ca, timeout_s=args.timeout) as control:
            info = control.save_snapshot({"reason": "ferret export"})
    except ControlCallError as exc:
        print(f"ferret export: the trainer at {args.from_trainer} took no snapshot: {exc.code.name}: {exc.details}",
              file=sys.stderr)  # fmt: skip
        return None
    return int(info.version), str(info.instance_id)
