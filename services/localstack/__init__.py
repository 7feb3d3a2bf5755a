"""The embedded local stack (DESIGN §5): Tansu as the Kafka broker and Valkey as Redis, as child
processes on free loopback ports. See docs/local-stack.md."""

from services.localstack.broker import TansuBroker, find_tansu_binary
from services.localstack.ports import free_port, port_accepts
from services.localstack.process import BinaryNotFoundError, LocalStackError
from services.localstack.redis_server import RedisServer, find_redis_binary
from services.localstack.stack import LocalStack

__all__ = [
    "BinaryNotFoundError",
    "LocalStack",
    "LocalStackError",
    "RedisServer",
    "TansuBroker",
    "find_redis_binary",
    "find_tansu_binary",
    "free_port",
    "port_accepts",
]
