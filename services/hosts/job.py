"""Joining a ``torchrun`` job as its coordinator or as a host that owns stages.

Every rank of the job runs under ``torchrun --nnodes H --nproc-per-node 1 --rdzv-backend c10d
--rdzv-endpoint HOST:PORT`` (one launcher per machine). :func:`join` initialises the job's gloo group from
the launcher's environment; rank 0 is the coordinator (it builds a
:class:`~ferret_core.engine.processes.hosts.Hosts` with :func:`coordinator_address` and runs the clock),
every other rank calls :func:`serve` (or is started as ``python -m services.hosts``).
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta

import grpc
import torch.distributed as dist

from ferret_core.engine.processes.follow import FOLLOW_SHARE
from ferret_core.engine.processes.host_agent import serve_host
from ferret_core.engine.processes.hosts import Hosts
from ferret_core.errors import ConfigError, ExecutorLost
from services.control.health import ControlHealth
from services.control.server import health_only_server

log = logging.getLogger("ferret.hosts")

EXIT_LOST = 3  # the coordinator went away: this host ended its executors
SETUP_TIMEOUT = timedelta(minutes=5)


def join() -> int:
    """Initialise the job's gloo group from ``torchrun``'s environment; returns this rank."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(
            f"not started by torchrun: {', '.join(missing)} unset; run every host as `torchrun --nnodes H "
            "--nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT ...`"
        )
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=SETUP_TIMEOUT)
    return dist.get_rank()


def coordinator_address() -> str:
    """Where the other hosts reach rank 0 (its executors' TCP store listens there): torchrun's MASTER_ADDR."""
    return os.environ["MASTER_ADDR"]


def trainer_hosts(follow_share: float = FOLLOW_SHARE) -> Hosts:
    """On the job's rank 0 (the trainer, ``trainer.hosts: torchrun``): the other hosts, which serve its clocks
    and send its predictions' copies of their stages at ``follow_share`` (``trainer.follow_share``)."""
    rank = join()
    if rank != 0:
        raise ConfigError(f"the trainer runs on rank 0 of the job, this is rank {rank}: call serve() here")
    hosts = Hosts(coordinator_address(), follow_share=follow_share)
    log.info("trainer on rank 0 of a job of %d host(s); the stages go to the others", hosts.world_size)
    return hosts


def end_job(hosts: Hosts) -> None:
    """The trainer is done: end the other hosts' agents (they exit 0) and leave the job's group."""
    hosts.shutdown()
    dist.destroy_process_group()


def serve(health_listen: str | None = None) -> int:
    """Serve the coordinator's clocks on this rank (not 0) until it ends the job; the exit status.

    ``health_listen`` (``control.health_listen``): also answer ``grpc.health.v1`` there, as the trainer's
    health port does, for the kubelet's probes of a pod in the job: ``ferret.liveness`` SERVING while this
    rank serves, the overall service ``""`` NOT_SERVING (this pod is not the trainer: a Service that routes
    control calls to Ready pods reaches rank 0 only)."""
    rank = join()
    if rank == 0:
        raise ConfigError("rank 0 is the coordinator: it runs the clock, the other ranks serve it")
    health = None if health_listen is None else host_health(health_listen)
    try:
        serve_host()
    except ExecutorLost as exc:  # a receive may still be blocked on the dead peer: leave now
        log.error("host rank %d: %s", rank, exc)
        sys.stderr.flush()
        os._exit(EXIT_LOST)
    finally:
        if health is not None:
            health.stop(grace=1)
    dist.destroy_process_group()
    return 0


def host_health(address: str) -> grpc.Server:
    """A started ``grpc.health.v1`` server at ``address`` for a rank that serves stages (see :func:`serve`)."""
    state = ControlHealth(ready=False)  # never the trainer: "" NOT_SERVING; ferret.liveness SERVING
    server, _ = health_only_server(state.servicer, address, "control.health_listen", "the host's health port")
    server.start()
    log.info("host health (liveness) on %s", address)
    return server
