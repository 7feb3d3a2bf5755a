"""Several hosts for the process clock: joining a ``torchrun`` job (c10d rendezvous), serving the stages a
host owns, and running a job's launchers on loopback (tests, benchmarks). The clock's side is
:mod:`ferret_core.engine.processes.hosts`; docs/processes.md § "Several hosts"."""
