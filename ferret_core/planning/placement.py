"""Where a plan's stages live when it runs over several hosts (the trainer's ``trainer.hosts: torchrun``).

Rank 0 of the job is the trainer: its host keeps the record path (consume, decode, predict every item,
publish, commit), which at saturation keeps a core busy by itself (docs/service.md "Executors"). So the
stages go to the *other* hosts: with H hosts and P stages, stage j is owned by rank 1 + ⌊j · (H − 1) / P⌋
(contiguous blocks, earlier stages on lower ranks, as a pipeline's neighbours should be), and each owner
runs its stages' executors of every worker (docs/processes.md "Several hosts": no worker-level placement).
One host (H = 1) owns everything itself, as without hosts.
"""

from __future__ import annotations

from ferret_core.errors import ConfigError


def stage_owners(num_stages: int, world_size: int) -> tuple[int, ...]:
    """The rank that owns each of ``num_stages`` stages in a job of ``world_size`` hosts (module docstring)."""
    if num_stages < 1 or world_size < 1:
        raise ConfigError(
            f"a plan needs >= 1 stage and a job >= 1 host, got {num_stages} stage(s) and {world_size} host(s)"
        )
    if world_size == 1:
        return (0,) * num_stages
    serving = world_size - 1
    return tuple(1 + (j * serving) // num_stages for j in range(num_stages))


def serving_hosts(world_size: int) -> int:
    """Hosts that run executors: every rank but the trainer's (its own when it is alone)."""
    return max(1, world_size - 1)
