"""Streaming metrics against plain references (STYLE lesson 8)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.errors import ConfigError, FerretError
from ferret_core.metrics import LatencyQuantiles, OnlineAccuracy, TestAccuracy, agm, tagm

labels = st.lists(st.integers(min_value=0, max_value=3), max_size=60)
pairs = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=60)
latencies = st.lists(st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False), max_size=60)


def _online(items: list[tuple[int, int]], history: bool = True) -> OnlineAccuracy:
    acc = OnlineAccuracy(history=history)
    for pred, true in items:
        acc.update(pred, true)
    return acc


# --- agm / tagm ------------------------------------------------------------------------------------


def test_agm_golden_mnist_oracle_vs_one_skip() -> None:
    # Paper, MNIST/MNISTNet: Oracle 81.14 vs 1-Skip 18.24 at equal memory => 27.32 (DESIGN §3.2).
    assert agm(81.14, 18.24, 1.0, 1.0) == pytest.approx(27.32, abs=0.01)
    assert tagm(81.14, 18.24, 5e6, 5e6) == pytest.approx(27.32, abs=0.01)


def test_agm_memory_ratio_is_base_10() -> None:
    assert agm(50.0, 50.0, 10.0, 1.0) == pytest.approx(-1.0)
    assert tagm(50.0, 50.0, 1.0, 100.0) == pytest.approx(2.0)
    assert agm(60.0, 50.0, 3, 3) == pytest.approx(10.0 / math.log(10.0))
    assert agm(np.float64(60.0), 50.0, 4, np.float64(2)) == pytest.approx(10 / math.log(10) - math.log10(2))


@pytest.mark.parametrize("fn", [agm, tagm])
@pytest.mark.parametrize("mem_a, mem_b", [(0, 1), (1, 0), (-5, 1), (1, math.inf), (math.nan, 1)])
def test_agm_rejects_non_positive_memory(fn, mem_a: float, mem_b: float) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="expected a finite memory > 0") as info:
        fn(50.0, 40.0, mem_a, mem_b)
    assert isinstance(info.value, FerretError) and isinstance(info.value, ValueError)
    assert "got" in str(info.value)


def test_agm_rejects_non_finite_accuracy() -> None:
    with pytest.raises(ConfigError, match="oacc_a"):
        agm(math.nan, 1.0, 1.0, 1.0)


@given(st.floats(0, 100), st.floats(0, 100), st.floats(1e-3, 1e12), st.floats(1e-3, 1e12), st.floats(1e-3, 1e3))
def test_agm_is_antisymmetric_and_scale_free(a: float, b: float, ma: float, mb: float, k: float) -> None:
    assert agm(a, b, ma, mb) == pytest.approx(-agm(b, a, mb, ma), abs=1e-9)
    assert agm(a, b, ma * k, mb * k) == pytest.approx(agm(a, b, ma, mb), abs=1e-9)


# --- OnlineAccuracy --------------------------------------------------------------------------------


@given(pairs)
def test_online_accuracy_equals_numpy_mean(items: list[tuple[int, int]]) -> None:
    acc = _online(items)
    pred = np.array([p for p, _ in items], dtype=np.int64)
    true = np.array([t for _, t in items], dtype=np.int64)
    expected = float(np.mean(pred == true) * 100) if items else 0.0
    assert acc.get() == pytest.approx(expected)
    assert acc.count == len(items)
    batch = OnlineAccuracy(history=True)
    batch.update_many(pred, true)
    assert batch.to_dict() == acc.to_dict()


@given(pairs, pairs)
def test_online_accuracy_merge_equals_concatenated_stream(a: list, b: list) -> None:  # type: ignore[type-arg]
    merged = _online(a) + _online(b)
    whole = _online(a + b)
    assert merged.to_dict() == whole.to_dict()
    assert merged.curve(every=7) == whole.curve(every=7)
    assert _online(a).merge(_online(b)).get() == pytest.approx(whole.get())


@given(pairs, st.integers(1, 10))
def test_online_accuracy_curve_matches_prefix_means(items: list[tuple[int, int]], every: int) -> None:
    acc = _online(items)
    hits = np.array([p == t for p, t in items], dtype=float)
    points = acc.curve(every=every)
    if not items:
        assert points == []
        return
    assert points[-1][0] == len(items)
    for t, value in points:
        assert t % every == 0 or t == len(items)
        assert value == pytest.approx(hits[:t].mean() * 100)


@given(pairs, st.booleans())
def test_online_accuracy_round_trips_through_json(items: list[tuple[int, int]], history: bool) -> None:
    acc = _online(items, history=history)
    again = OnlineAccuracy.from_dict(json.loads(json.dumps(acc.to_dict())))
    assert again.to_dict() == acc.to_dict()
    assert again.history == history


def test_online_accuracy_accepts_tensors_and_reports_percent() -> None:
    acc = OnlineAccuracy()
    acc.update(torch.tensor(3), 3)
    acc.update_many(torch.tensor([1, 2, 0]), torch.tensor([1, 0, 0]))
    assert acc.get() == pytest.approx(75.0)
    assert OnlineAccuracy().get() == 0.0


def test_online_accuracy_errors() -> None:
    with pytest.raises(ConfigError, match="history=True"):
        OnlineAccuracy().curve()
    with pytest.raises(ConfigError, match="same length"):
        OnlineAccuracy().update_many([1, 2], [1])
    with pytest.raises(ConfigError, match="integer class labels"):
        OnlineAccuracy().update_many(np.array([0.5]), np.array([1]))
    with pytest.raises(ConfigError, match="expected a 'online_accuracy' state"):
        OnlineAccuracy.from_dict({"kind": "test_accuracy", "count": 1, "correct": 1})
    with pytest.raises(ConfigError, match="0 <= correct <= count"):
        OnlineAccuracy.from_dict({"kind": "online_accuracy", "count": 1, "correct": 2})
    with pytest.raises(ConfigError, match="cannot merge"):
        OnlineAccuracy().merge(TestAccuracy())  # type: ignore[arg-type]


def test_merge_without_history_drops_the_curve() -> None:
    merged = _online([(1, 1)], history=True) + _online([(0, 1)], history=False)
    assert merged.get() == 50.0 and not merged.history


# --- TestAccuracy ----------------------------------------------------------------------------------


@given(st.lists(pairs, max_size=5))
def test_test_accuracy_over_batches_equals_numpy_mean(batches: list[list[tuple[int, int]]]) -> None:
    acc = TestAccuracy()
    parts = [TestAccuracy() for _ in batches]
    for part, batch in zip(parts, batches, strict=True):
        pred = torch.tensor([p for p, _ in batch], dtype=torch.long)
        true = np.array([t for _, t in batch], dtype=np.int64)
        acc.update(pred, true)
        part.update(pred, true)
    flat = [item for batch in batches for item in batch]
    expected = float(np.mean([p == t for p, t in flat]) * 100) if flat else 0.0
    assert acc.get() == pytest.approx(expected)
    merged = TestAccuracy()
    for part in parts:
        merged = merged + part
    assert merged.to_dict() == acc.to_dict()
    assert TestAccuracy.from_dict(json.loads(json.dumps(acc.to_dict()))).to_dict() == acc.to_dict()


# --- LatencyQuantiles ------------------------------------------------------------------------------


@given(latencies, st.floats(0.0, 1.0))
def test_quantiles_equal_numpy_linear(values: list[float], q: float) -> None:
    lat = LatencyQuantiles(window=1000)
    lat.update_many(values)
    if not values:
        assert math.isnan(lat.quantile(q))
        return
    expected = float(np.quantile(np.array(values), q, method="linear"))
    assert lat.quantile(q) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert lat.count == len(values)
    assert lat.mean == pytest.approx(float(np.mean(values)))
    assert lat.max == max(values)


@given(latencies, st.integers(1, 20))
def test_quantiles_use_the_last_window_only(values: list[float], window: int) -> None:
    lat = LatencyQuantiles((0.5, 0.99), window=window)
    lat.update_many(values)
    if values:
        kept = np.array(values[-window:])
        assert lat.get()["p50"] == pytest.approx(float(np.quantile(kept, 0.5)), rel=1e-9, abs=1e-9)
        assert lat.get()["p99"] == pytest.approx(float(np.quantile(kept, 0.99)), rel=1e-9, abs=1e-9)


@given(latencies, latencies, st.integers(1, 50))
def test_quantiles_merge_equals_concatenated_stream(a: list[float], b: list[float], window: int) -> None:
    la, lb, whole = (LatencyQuantiles(window=window) for _ in range(3))
    la.update_many(a)
    lb.update_many(b)
    whole.update_many(a + b)
    merged = la + lb
    assert merged.to_dict()["values"] == whole.to_dict()["values"]
    assert merged.count == whole.count and merged.max == whole.max
    assert merged.total == pytest.approx(whole.total)
    again = LatencyQuantiles.from_dict(json.loads(json.dumps(merged.to_dict())))
    assert again.to_dict() == merged.to_dict()


def test_quantile_keys_and_errors() -> None:
    lat = LatencyQuantiles((0.5, 0.999))
    lat.update(0.25)
    assert lat.get() == {"p50": 0.25, "p99.9": 0.25}
    with pytest.raises(ConfigError, match="finite number >= 0"):
        lat.update(-1.0)
    with pytest.raises(ConfigError, match="window"):
        LatencyQuantiles(window=0)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        LatencyQuantiles((1.5,))
    with pytest.raises(ConfigError, match="different settings"):
        lat.merge(LatencyQuantiles((0.5,)))
