"""What ``ferret demo --keep-stack`` leaves running, and how a user reaches it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeptStack:
    """What ``--keep-stack`` left running, and how to reach it."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    redis_url: str
    control_target: str
    metrics_url: str
    pids: dict[str, int]
    embedded_kafka: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """How to reach the kept topics, control plane and metrics, and how to stop it all."""
        pids = " ".join(str(pid) for pid in self.pids.values())
        lines = [
            "the stack keeps running (--keep-stack):",
            f"  Kafka       {self.bootstrap_servers}  topics {', '.join(self.topics)}",
            f"  Redis       {self.redis_url}",
            f"  control     ferret control --target {self.control_target} status   (also: watch, budget, snapshot)",
            f"  metrics     curl -s {self.metrics_url}",
            *(
                f"  predictions ferret predictions tail --bootstrap-servers {self.bootstrap_servers} "
                f"--topic-prefix {topic.removesuffix('.predictions')} --from-beginning"
                for topic in self.topics
                if topic.endswith(".predictions")
            ),
            f"  processes   {', '.join(f'{k} {v}' for k, v in self.pids.items())}",
            f"  stop it     kill {pids}",
        ]
        if self.embedded_kafka:
            lines.append(
                "  the embedded broker (Tansu) serves confluent-kafka / librdkafka clients (ferret, Python); "
                "kcat 1.7 fails its ApiVersion handshake: for Kafka CLI tools use the compose stack "
                "(docs/local-stack.md)"
            )
        return "\n".join(lines)
