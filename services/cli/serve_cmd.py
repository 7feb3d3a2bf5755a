"""``ferret serve``: follow a trainer's model stream and answer ``ferret.v1.Serving`` Predict over gRPC."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import threading
from pathlib import Path

from services.cli.args import existing_file, positive_float
from services.cli.logs import add_logging_arguments, configure_logging
from services.config import load_settings

TOKEN_ENV = "FERRET_SERVING_TOKEN"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the trainer's newest model over gRPC (ferret.v1.Serving Predict), following its model stream",
        description=(
            "Follow a trainer replica's model stream in Redis (<redis.namespace>:models:{<instance>}, published "
            "every trainer.models_interval_s), starting from the newest complete model, and answer "
            "ferret.v1.Serving Predict (a batch of tensors -> classes, probabilities, model version) with "
            "grpc.health.v1, reflection and Prometheus metrics. serving.token / tls_cert / tls_key apply as the "
            "control plane's do. With --predict FILE.npy it is instead a client: one Predict to --target."
        ),
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML settings file (default $FERRET_CONFIG)")
    parser.add_argument("--redis-url", default=None, metavar="URL", help="Redis (default: redis.url)")
    parser.add_argument(
        "--instance-id", default=None, help="trainer replica to follow (default: serving.instance_id, else kafka's)"
    )
    parser.add_argument("--listen", default=None, metavar="HOST:PORT", help="default: serving.listen, 127.0.0.1:50061")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="Prometheus port, 0 for a free one (default: metrics.port)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for Predict (default 1)")
    client = parser.add_argument_group("client (one Predict instead of serving)")
    client.add_argument(
        "--predict", type=existing_file, default=None, metavar="FILE.npy",
        help="a NumPy batch [B, *input_shape] (uint8 or float32) to send to --target (default: serve)",
    )  # fmt: skip
    client.add_argument(
        "--target", default="127.0.0.1:50061", help="HOST:PORT of a serving process (default 127.0.0.1:50061)"
    )
    client.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token (default ${TOKEN_ENV})")
    client.add_argument(
        "--tls-ca", type=existing_file, default=None, help="PEM CA file: connect with TLS (default: plaintext)"
    )
    client.add_argument("--timeout", type=positive_float, default=30.0, help="seconds (default 30)")
    add_logging_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    if args.predict is not None:
        return predict_once(args)
    settings = load_settings(args.config)
    overrides = {
        "redis": {"url": args.redis_url},
        "serving": {"instance_id": args.instance_id, "listen": args.listen},
        "metrics": {"port": args.metrics_port},
    }
    for section, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            section_settings = dataclasses.replace(getattr(settings, section), **given)
            settings = dataclasses.replace(settings, **{section: section_settings})
    import torch

    from services.control.auth import ServerTls
    from services.serving.model_stream import ModelStreamReader, stream_key
    from services.serving.server import create_serving_server
    from services.snapshots import redis_client
    from services.trainer.metrics_http import serve_metrics

    torch.set_num_threads(max(1, args.threads))
    torch.set_flush_denormal(True)
    s, r = settings.serving, settings.redis
    instance = s.instance_id or settings.kafka.resolved_instance_id()
    client = redis_client(r.url, socket_timeout_s=max(r.timeout_s, 5.0))  # above XREAD's 1 s block
    reader = ModelStreamReader(client, stream_key(r.namespace, instance))
    tls = ServerTls(s.tls_cert, s.tls_key) if s.tls_cert is not None and s.tls_key is not None else None
    server = create_serving_server(
        reader, address=s.listen, token=s.token, tls=tls, insecure=s.insecure, health_address=s.health_listen,
        max_batch=s.max_batch,
    ).start()  # fmt: skip
    metrics = None if settings.metrics.port is None else serve_metrics(server.metrics.registry, settings.metrics)
    print(json.dumps({"serving": server.target, "stream": reader.key, "metrics_port": metrics and metrics.port}),
          flush=True)  # fmt: skip
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        server.stop(grace_s=5)
        if metrics is not None:
            metrics.stop()
        client.close()
    return 0


def predict_once(args: argparse.Namespace) -> int:
    import numpy as np

    from services.serving.client import ServingClient

    xs = np.load(args.predict, allow_pickle=False)
    with ServingClient(args.target, token=args.token, tls_ca=args.tls_ca, timeout_s=args.timeout) as client:
        reply = client.predict(xs)
    print(json.dumps({"model_version": reply.model_version, "classes": list(reply.classes),
                      "confidences": [round(c, 6) for c in reply.confidences]}))  # fmt: skip
    return 0
