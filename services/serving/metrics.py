"""Prometheus metrics of ``ferret serve`` (its own registry and endpoint, docs/metrics.md "Serving"):

==========================================  =========================================================
``ferret_serving_model_version``            the version of the model in force (-1: none yet)
``ferret_serving_model_freshness_seconds``  when the model in force arrived − the trainer's update time
``ferret_serving_model_age_seconds``        now − the trainer's update time of the model in force
``ferret_serving_model_updates_total``      updates put in force
``ferret_serving_predict_latency_seconds``  Predict handling time (histogram; decode, forward, reply)
``ferret_serving_predictions_total``        samples predicted
``ferret_serving_predict_errors_total``     failed Predict calls, by gRPC code
==========================================  =========================================================
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.serving.holder import ModelHolder, ServedModel

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
FRESHNESS_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServingMetrics:
    """The serving process's metrics over its :class:`ModelHolder`."""

    def __init__(self, holder: ModelHolder) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._version = Gauge("ferret_serving_model_version", "Version of the model in force (-1: none)", registry=r)
        self._version.set_function(lambda: _version(holder.peek()))
        self._freshness = Histogram(
            "ferret_serving_model_freshness_seconds",
            "Arrival of a model update in this process minus the trainer's update time",
            buckets=FRESHNESS_BUCKETS_S,
            registry=r,
        )
        self._age = Gauge(
            "ferret_serving_model_age_seconds", "Now minus the trainer's update time of the model in force", registry=r
        )
        self._age.set_function(lambda: _age(holder.peek()))
        self._updates = Counter("ferret_serving_model_updates", "Model updates put in force", registry=r)
        self.latency = Histogram(
            "ferret_serving_predict_latency_seconds", "Predict handling time", buckets=LATENCY_BUCKETS_S, registry=r
        )
        self.predictions = Counter("ferret_serving_predictions", "Samples predicted", registry=r)
        self.errors = Counter("ferret_serving_predict_errors", "Failed Predict calls", ["code"], registry=r)

    def observe_update(self, served: ServedModel) -> None:
        self._updates.inc()
        self._freshness.observe(max(0.0, (served.received_ms - served.update_ms) / 1000))


def _version(served: ServedModel | None) -> float:
    return -1.0 if served is None else float(served.version)


def _age(served: ServedModel | None) -> float:
    return float("nan") if served is None else max(0.0, time.time() - served.update_ms / 1000)
