"""``ferret run``: the trainer service."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from services.cli.args import budget_type
from services.config import load_settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the trainer: Kafka samples → predictions, the planned Ferret pipeline, gRPC control",
        description=(
            "Consume <prefix>.samples, predict every item on arrival, train Ferret's planned pipeline and "
            "publish one prediction per item to <prefix>.predictions. Settings come from --config (YAML) "
            "and FERRET_* variables; the flags below override them. Stops cleanly on SIGTERM/SIGINT."
        ),
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML settings file (default $FERRET_CONFIG)")
    parser.add_argument("--bootstrap-servers", default=None)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--topic-prefix", default=None)
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--budget", type=budget_type, default=None, help="memory budget (bytes or 512MiB)")
    parser.add_argument("--profile", type=Path, default=None, help="profile JSON of the model")
    parser.add_argument("--listen", default=None, help="gRPC control address, e.g. 127.0.0.1:50051")
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings(args.config)
    overrides = {
        "kafka": {"bootstrap_servers": args.bootstrap_servers, "topic_prefix": args.topic_prefix},
        "redis": {"url": args.redis_url},
        "trainer": {"dataset": args.dataset, "model": args.model, "budget_bytes": args.budget, "profile": args.profile},
        "control": {"listen": args.listen},
        "metrics": {"port": args.metrics_port},
    }
    for section, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            settings = dataclasses.replace(
                settings, **{section: dataclasses.replace(getattr(settings, section), **given)}
            )
    from services.trainer.runner import run_trainer

    return run_trainer(settings)
