"""The demo's process life cycle (DESIGN §6): local stack → topics → trainer → producer → one budget
change over gRPC → snapshot → SIGTERM → read-back → report.

Every part is a separate process talking over loopback: the broker and Redis (``LocalStack``, or
external ones), ``ferret run`` and ``ferret produce`` (``ChildProcess``: own session, log file in the
out dir). The orchestrator is a gRPC client of the trainer like any other: it waits for the standard
health service to say SERVING, refreshes the view from ``GetStatus``, changes the budget with
``SetMemoryBudget`` and asks for a snapshot with ``SaveSnapshot``. Counts come from an independent
consumer of the topics afterwards.

Stopping: at the end, on a failure and on Ctrl-C alike, the producer is stopped, then the trainer
(SIGTERM: it drains, snapshots and commits), then the stack. While that runs, a further SIGINT/SIGTERM
kills the children at once instead of interrupting the clean-up, so no process is left behind. Should
the demo itself be killed outright (SIGKILL, the OOM killer), the kernel kills every child with it: they
are started through :mod:`services.localstack.deathsig`.

``keep_stack``: the broker, Redis and the trainer are started without that link and left running when
the run ends by itself (its report written; a Ctrl-C still stops everything); :attr:`DemoRun.kept` says
where they are, and ``stack.json`` in the out dir records it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

import grpc
import redis

from ferret_core.errors import FerretError, InfeasibleBudgetError
from services import strict_json
from services.control.client import ControlCallError, ControlClient
from services.demo.collect import Outcome, read_outcome
from services.demo.commands import (
    SNAPSHOT_KEY_ENV,
    SNAPSHOT_NAMESPACE,
    Endpoints,
    delivered_count,
    last_log_line,
    producer_command,
    producer_env,
    serving_probe,
    trainer_command,
    trainer_env,
    trainer_identity,
)
from services.demo.kept import KeptStack
from services.demo.live_view import View, make_view
from services.demo.options import BudgetStep, DemoOptions, budget_step
from services.demo.plain_phase import PlainConsumerResult, run_plain_phase
from services.demo.record import BudgetChange, BudgetRefusal, PlanView, RunRecord, StatusPoint
from services.demo.report import PRODUCER_LOG, TRAINER_LOG, write_report
from services.kafka.admin import TopicNames, ensure_topics
from services.kafka.record_codec import now_ms
from services.localstack import LocalStack, LocalStackError, free_port
from services.localstack.process import ChildProcess, ServerExitedError, log_tail
from services.snapshots import SnapshotStore

EXIT_INFEASIBLE = 3
KEPT_STACK_FILE = "stack.json"
STATUS_GRACE_S = 10.0  # GetStatus may fail this long (e.g. while the trainer exits) before the demo gives up
_MIN_FEASIBLE = re.compile(r"minimum feasible (\d+) bytes")
log = logging.getLogger("ferret.demo")


class DemoError(FerretError, RuntimeError):
    """A part of the demo failed; ``log_path`` names the log whose tail explains it, when there is one."""

    def __init__(self, reason: str, log_path: Path | None = None) -> None:
        super().__init__(reason)
        self.log_path = log_path


class DemoRun:
    """One run of the demo; :meth:`run` returns the summary (and leaves the report in ``out_dir``)."""

    def __init__(self, options: DemoOptions, *, view_stream: TextIO | None = None) -> None:
        self.options = options
        self.out_dir = options.out_dir
        self.record = RunRecord(
            dataset=options.dataset,
            model=options.model,
            profile=str(options.profile) if options.profile is not None else None,
            items_requested=options.items,
            rate=options.rate,
            topic_prefix=options.topic_prefix,
            out_dir=options.out_dir,
            started_time_ms=now_ms(),
        )
        self._view_stream = view_stream
        self._view: View | None = None
        self._phase = "starting"
        self._children: list[ChildProcess] = []
        self._stack_pids: dict[str, int] = {}
        self._snapshot_key = ""  # what the trainer signs its snapshots with (the read-back verifies them)
        self._status_failing_since: float | None = None
        self._wake = threading.Event()  # set by the budget-change worker when its call returns
        self.kept: KeptStack | None = None  # set when keep_stack left the stack running
        self._endpoints: Endpoints | None = None

    # -- the run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the demo and write the report; raises :class:`DemoError` (after writing a partial report)
        when a part fails, ``KeyboardInterrupt`` on Ctrl-C (after stopping everything)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        o, record = self.options, self.record
        stack = LocalStack(
            bootstrap_servers=o.bootstrap_servers,
            redis_url=o.redis_url,
            run_dir=self.out_dir / "stack",
            keep_run_dir=True,
            die_with_parent=not o.keep_stack,
        )
        outcome: Outcome | None = None
        plain: PlainConsumerResult | None = None
        failed = True
        interrupted = False
        try:
            with make_view(o.live, self._view_stream, o.log_format) as view:
                self._view = view
                record.error = self._stream(stack)  # None unless the stream stalled
                self._set_phase("reading the topics back")
                outcome = read_outcome(record.bootstrap_servers, o.topic_prefix)
                self._read_stored_snapshots()
                if o.plain_consumer and self._endpoints is not None:
                    self._set_phase("the plain consumer on the same stream (after Ferret's run)")
                    plain = self._run_plain_consumer(self._endpoints)
                self._set_phase("done" if record.error is None else f"incomplete: {record.error}")
            failed = False
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            record.error = "interrupted" if interrupted else str(exc).splitlines()[0]
            raise
        finally:
            self._view = None
            record.ended_time_ms = now_ms()
            with self._kill_on_signal():
                if o.keep_stack and not interrupted:
                    self._keep(stack)
                else:
                    self._stop_children()
                    stack.stop()
            if failed:  # the run's own error is the one to report; a report that fails too is secondary
                with contextlib.suppress(Exception):
                    write_report(self.out_dir, record, outcome)
        baseline = None
        if outcome is not None and outcome.predictions:
            from services.demo.baseline import demo_baseline  # torch: only when there is something to replay

            try:
                baseline = demo_baseline(outcome.predictions, o.dataset, o.model, o.data_root)
            except Exception as exc:  # the baseline is context for the reader, never the run's failure
                logging.getLogger(__name__).warning("the plain-loop baseline could not be replayed: %s", exc)
        summary = write_report(self.out_dir, record, outcome, baseline, plain)
        if record.error is not None:
            raise DemoError(record.error, self.out_dir / TRAINER_LOG)
        return summary

    def _stream(self, stack: LocalStack) -> str | None:
        """Everything up to the trainer's clean exit; returns why the run is incomplete, or None."""
        o, record = self.options, self.record
        self._set_phase("starting the local stack")
        stack.start()
        record.bootstrap_servers, record.redis_url = stack.bootstrap_servers, stack.redis_url
        self._stack_pids = stack.pids()
        record.stack = (
            f"Kafka {'embedded Tansu' if stack.embedded_kafka else 'external'}, "
            f"Redis {'embedded Valkey' if stack.embedded_redis else 'external'}"
        )
        self._set_phase("creating topics")
        ensure_topics(record.bootstrap_servers, o.topic_prefix, sample_partitions=o.partitions)
        endpoints = Endpoints(record.bootstrap_servers, record.redis_url, f"127.0.0.1:{free_port()}", free_port())
        record.control_target, record.metrics_port = endpoints.control_target, endpoints.metrics_port
        self._endpoints = endpoints

        self._set_phase("starting the trainer")
        env = trainer_env(o, stack.snapshot_key)
        self._snapshot_key = env[SNAPSHOT_KEY_ENV]
        trainer = self._spawn("trainer", trainer_command(o, endpoints), TRAINER_LOG, env)
        record.trainer_ready_s = self._wait_serving(trainer, endpoints.control_target)
        with ControlClient(endpoints.control_target, timeout_s=max(60.0, o.stop_timeout_s)) as client:
            record.plan_before = PlanView.from_reply(client.get_plan())
            step = self._budget_step(record.plan_before)
            self._set_phase("streaming")
            producer = self._spawn("producer", producer_command(o, endpoints), PRODUCER_LOG, producer_env())
            incomplete = self._follow(client, trainer, producer, step)
            self._set_phase("snapshot")
            info = client.save_snapshot({"reason": "demo", "run": o.topic_prefix})
            record.snapshot_requested = {
                "version": info.version,
                "total_bytes": info.total_bytes,
                "chunks": info.chunks,
                "seconds": info.seconds,
                "plan_version": info.plan_version,
                "offsets": {f"{x.topic}[{x.partition}]": x.offset for x in info.offsets},
            }
            record.timeline.append(StatusPoint.from_reply(client.get_status()))
            self._update_view()
        if o.keep_stack:
            return incomplete  # the trainer keeps running (it has published every outcome counted)
        self._set_phase("stopping the trainer (drain, snapshot, commit)")
        record.trainer_exit_code = trainer.stop(timeout=o.stop_timeout_s)
        if record.trainer_exit_code != 0:
            raise DemoError(
                f"the trainer exited with status {record.trainer_exit_code} on SIGTERM "
                f"(expected 0 after draining within {o.stop_timeout_s:g} s)",
                trainer.log_path,
            )
        return incomplete

    def _follow(
        self, client: ControlClient, trainer: ChildProcess, producer: ChildProcess, step: BudgetStep
    ) -> str | None:
        """Refresh the view until every produced item has its outcome; take the budget step once on the way
        (a change, or the expected refusal). Returns why the run is incomplete (no progress for
        ``stall_timeout_s``), or None."""
        o, record = self.options, self.record
        change: Future[tuple[BudgetChange | BudgetRefusal, PlanView]] | None = None
        progress, progress_at = -1, time.monotonic()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferret-demo-budget")
        try:
            while True:
                self._wake.wait(o.tick_s)
                self._wake.clear()
                point = self._status(client, trainer)
                if point is None:
                    continue
                record.timeline.append(point)
                if record.producer_exit_code is None and not producer.running:
                    self._producer_finished(producer)
                target = record.items_produced
                threshold = o.change_after_predictions if target is None else min(o.change_after_predictions, target)
                if change is None and point.predictions_published >= threshold:
                    record.measured_bytes_before_change = point.measured_bytes
                    change = pool.submit(self._take_budget_step, client, step, point)
                if change is not None and change.done() and not record.budget_step_done:
                    self._budget_changed(change)
                if change is not None and not record.budget_step_done:
                    self._phase = (
                        "streaming; asking for an infeasible budget over gRPC (no smaller plan exists)"
                        if step.refusal
                        else "streaming; changing the budget over gRPC"
                    )
                else:
                    self._phase = "streaming" if target is None else "draining: waiting for the last predictions"
                self._update_view()
                if target is not None and point.outcomes >= target and record.budget_step_done:
                    record.complete = True
                    return None
                if point.outcomes > progress:
                    progress, progress_at = point.outcomes, time.monotonic()
                elif time.monotonic() - progress_at > o.stall_timeout_s:
                    return (
                        f"no progress for {o.stall_timeout_s:g} s: {point.outcomes} of "
                        f"{target if target is not None else '?'} items have an outcome"
                    )
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # an in-flight call ends when the channel closes

    def _run_plain_consumer(self, endpoints: Endpoints) -> PlainConsumerResult:
        """The live plain consumer on the same items and rate (:mod:`services.demo.plain_phase`); its
        failure is recorded, not raised (the baseline is context, not the run)."""
        try:
            result = run_plain_phase(self.options, endpoints, self._spawn, self.out_dir)
        except Exception as exc:
            result = PlainConsumerResult(error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        if result.error is not None:
            log.warning("the live plain consumer has no result: %s", result.error)
        else:
            log.info(
                "live plain consumer: online accuracy %.2f %%, trained %d of %d",
                result.accuracy or 0.0,
                result.trained,
                result.labelled,
            )
        return result

    # -- steps -----------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], log_name: str, env: dict[str, str]) -> ChildProcess:
        kept = self.options.keep_stack and name == "trainer"
        child = ChildProcess(name, argv, self.out_dir / log_name, env=env, die_with_parent=not kept)
        (self.out_dir / log_name).write_text(f"$ {' '.join(argv)}\n")
        child.start()
        self._children.append(child)
        self._write_pids()
        return child

    def _wait_serving(self, trainer: ChildProcess, target: str) -> float:
        probe, close = serving_probe(target)
        try:
            return trainer.wait_ready(probe, timeout=self.options.startup_timeout_s, interval=0.05)
        except ServerExitedError:
            raise self._trainer_exited("before it was ready") from None
        except LocalStackError:
            raise DemoError(
                f"the trainer's control plane at {target} did not report SERVING within "
                f"{self.options.startup_timeout_s:g} s",
                trainer.log_path,
            ) from None
        finally:
            close()

    def _trainer_exited(self, when: str) -> FerretError:
        trainer = next(child for child in self._children if child.name == "trainer")
        code = trainer.returncode
        if code == EXIT_INFEASIBLE and self.options.budget is not None:
            found = _MIN_FEASIBLE.findall(log_tail(trainer.log_path, lines=50))
            if found:
                return InfeasibleBudgetError(self.options.budget, int(found[-1]))
        return DemoError(
            f"the trainer exited with status {code} {when}{last_log_line(trainer.log_path)}", trainer.log_path
        )

    def _budget_step(self, plan: PlanView) -> BudgetStep:
        """The budget step for the start-up plan (:func:`services.demo.options.budget_step`), logged and
        recorded: a cut when a smaller plan exists, else the refusal the demo shows instead."""
        step = budget_step(plan.min_feasible_bytes, plan.planned_bytes, self.options.new_budget)
        self.record.budget_step = f"{'refusal' if step.refusal else 'cut'} to {step.budget} bytes: {step.why}"
        log.info("budget step: %s", self.record.budget_step)
        return step

    def _take_budget_step(
        self, client: ControlClient, step: BudgetStep, before: StatusPoint
    ) -> tuple[BudgetChange | BudgetRefusal, PlanView]:
        """On the worker thread: the step's SetMemoryBudget call (a refusal when one was expected), and the
        plan in force after it."""
        if not step.refusal:
            return self._change_budget(client, step.budget, before)
        plan = self.record.plan_before
        assert plan is not None
        requested, began = now_ms(), time.monotonic()
        try:
            reply = client.set_memory_budget(step.budget)
        except ControlCallError as exc:
            if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            refused = exc
        else:  # accepted after all (a smaller plan appeared): an ordinary change
            after = PlanView.from_reply(reply)
            return self._recorded_change(reply, after, step.budget, requested, began, before), after
        finally:
            self._wake.set()
        after = PlanView.from_reply(client.get_plan())
        refusal = BudgetRefusal(
            requested_time_ms=requested,
            to_bytes=step.budget,
            code=refused.code.name,
            details=refused.details,
            min_feasible_bytes=refused.min_feasible_bytes,
            call_seconds=time.monotonic() - began,
            predictions_before=before.predictions_published,
            plan_version_before=plan.version,
            plan_version_after=after.version,
            plan_changed=after.plan != plan.plan,
        )
        return refusal, after

    def _status(self, client: ControlClient, trainer: ChildProcess) -> StatusPoint | None:
        """The trainer's status; None while GetStatus has failed for less than ``STATUS_GRACE_S`` (a
        trainer that is exiting refuses calls before its process is gone: the next tick tells)."""
        if not trainer.running:
            raise self._trainer_exited("while streaming")
        try:
            point = StatusPoint.from_reply(client.get_status())
        except ControlCallError as exc:
            self._status_failing_since = self._status_failing_since or time.monotonic()
            if time.monotonic() - self._status_failing_since > STATUS_GRACE_S:
                raise DemoError(f"GetStatus failed for {STATUS_GRACE_S:g} s: {exc}", trainer.log_path) from None
            return None
        self._status_failing_since = None
        return point

    def _producer_finished(self, producer: ChildProcess) -> None:
        record = self.record
        record.producer_exit_code = producer.returncode
        if producer.returncode != 0:
            raise DemoError(
                f"the producer exited with status {producer.returncode}{last_log_line(producer.log_path)}",
                producer.log_path,
            )
        record.items_produced = delivered_count(producer.log_path)
        if record.items_produced is None:
            raise DemoError("the producer exited without its final report line", producer.log_path)

    def _change_budget(self, client: ControlClient, budget: int, before: StatusPoint) -> tuple[BudgetChange, PlanView]:
        """On the worker thread: one SetMemoryBudget call (the trainer re-plans without stopping)."""
        plan = self.record.plan_before
        assert plan is not None
        requested, began = now_ms(), time.monotonic()
        try:
            reply = client.set_memory_budget(budget)
        finally:
            self._wake.set()
        after = PlanView.from_reply(reply)
        return self._recorded_change(reply, after, budget, requested, began, before), after

    def _recorded_change(
        self, reply: Any, after: PlanView, budget: int, requested: int, began: float, before: StatusPoint
    ) -> BudgetChange:
        plan = self.record.plan_before
        assert plan is not None
        return BudgetChange(
            requested_time_ms=requested,
            applied_time_ms=reply.applied_time_ms,
            from_bytes=plan.budget_bytes,
            to_bytes=budget,
            planning_seconds=reply.planning_seconds,
            stall_seconds=reply.stall_seconds,
            call_seconds=time.monotonic() - began,
            predictions_before=before.predictions_published,
            plan_version_before=plan.version,
            plan_version_after=after.version,
            planned_bytes_before=plan.planned_bytes,
            planned_bytes_after=after.planned_bytes,
            plan_changed=after.plan != plan.plan,
        )

    def _budget_changed(self, future: Future[tuple[BudgetChange | BudgetRefusal, PlanView]]) -> None:
        try:
            outcome, after = future.result()
        except ControlCallError as exc:
            if exc.code == grpc.StatusCode.FAILED_PRECONDITION and exc.min_feasible_bytes is not None:
                raise InfeasibleBudgetError(self.options.new_budget or 0, exc.min_feasible_bytes) from None
            raise DemoError(f"the budget change failed: {exc}", self.out_dir / TRAINER_LOG) from None
        self.record.plan_after = after
        if isinstance(outcome, BudgetRefusal):
            self.record.budget_refusal = outcome
            log.info(
                "budget step: SetMemoryBudget(%d) refused as expected: %s (minimum feasible %s bytes); plan v%d "
                "unchanged",
                outcome.to_bytes,
                outcome.code,
                outcome.min_feasible_bytes,
                outcome.plan_version_after,
            )
        else:
            self.record.budget_changes.append(outcome)

    def _read_stored_snapshots(self) -> None:
        """The trainer's snapshots as Redis holds them after its exit (checksums and signatures verified)."""
        _, instance_id = trainer_identity(self.options)
        client = redis.Redis.from_url(self.record.redis_url)
        try:
            key = self._snapshot_key.encode() if self._snapshot_key else None
            store = SnapshotStore(client, SNAPSHOT_NAMESPACE, instance_id, hmac_key=key)
            self.record.snapshots_stored = [
                {
                    "version": s.version,
                    "valid": s.valid,
                    "error": s.error or None,
                    "created_at": s.manifest.created_at if s.manifest else None,
                    "total_bytes": s.manifest.total_bytes if s.manifest else None,
                    "chunks": len(s.manifest.chunks) if s.manifest else None,
                    "plan_version": s.manifest.meta.get("plan_version") if s.manifest else None,
                    "reason": s.manifest.meta.get("reason") if s.manifest else None,
                }
                for s in store.list_snapshots(verify=True)
            ]
        finally:
            client.close()
        requested = self.record.snapshot_requested
        stored = {s["version"]: s for s in self.record.snapshots_stored}
        if requested is not None and not requested["total_bytes"] and requested["version"] in stored:
            # the SaveSnapshot reply may leave sizes unset; the manifest in Redis has them
            match = stored[requested["version"]]
            requested.update(total_bytes=match["total_bytes"], chunks=match["chunks"])

    # -- view, pids, stopping ----------------------------------------------------------------------------
    def _set_phase(self, phase: str) -> None:
        self._phase = phase
        self._update_view()

    def _update_view(self) -> None:
        if self._view is not None:
            self._view.update(self.record, self._phase)

    def _write_pids(self) -> None:
        pids = {**self._stack_pids, **{child.name: child.pid for child in self._children}}
        (self.out_dir / "pids.json").write_text(strict_json.dumps(pids) + "\n")

    def _stop_children(self) -> None:
        """Producer first, then the trainer (SIGTERM: drain, snapshot, commit), each SIGKILLed after
        its timeout. A no-op for children that already exited."""
        for child in reversed(self._children):
            timeout = self.options.stop_timeout_s if child.name == "trainer" else 10.0
            code = child.stop(timeout=timeout)
            if child.name == "trainer" and self.record.trainer_exit_code is None:
                self.record.trainer_exit_code = code
            if child.name == "producer" and self.record.producer_exit_code is None:
                self.record.producer_exit_code = code

    def _keep(self, stack: LocalStack) -> None:
        """Stop the producer, leave the trainer and the embedded servers running, record where they are."""
        kept: dict[str, int] = dict(stack.pids())
        for child in reversed(self._children):
            if child.name == "trainer" and child.running and child.pid is not None:
                child.release()
                kept["trainer"] = child.pid
            else:
                code = child.stop(timeout=10.0)
                if child.name == "producer" and self.record.producer_exit_code is None:
                    self.record.producer_exit_code = code
        stack.release()
        record = self.record
        self.kept = KeptStack(
            bootstrap_servers=record.bootstrap_servers,
            topics=TopicNames(self.options.topic_prefix).all(),
            redis_url=record.redis_url,
            control_target=record.control_target,
            metrics_url=f"http://127.0.0.1:{record.metrics_port}/metrics",
            pids=kept,
            embedded_kafka=stack.embedded_kafka,
        )
        (self.out_dir / KEPT_STACK_FILE).write_text(strict_json.dumps(self.kept.to_dict(), indent=2) + "\n")

    def _kill_children(self) -> None:
        for child in self._children:
            if child.running and child.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)

    @contextlib.contextmanager
    def _kill_on_signal(self) -> Iterator[None]:
        """While stopping: SIGINT/SIGTERM kill the children at once rather than interrupt the clean-up."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: object) -> None:
            self._kill_children()

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
