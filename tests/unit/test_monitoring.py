"""The monitoring files (monitoring/, the compose `monitoring` profile) against the code: Prometheus'
own ``promtool`` checks the scrape config and parses every PromQL query of the Grafana dashboard, and
every metric the dashboard reads is one the trainer exports (docs/metrics.md)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.config import load_settings
from services.trainer.metrics import TrainerMetrics

from .test_deploy_manifests import compose, service_env
from .test_trainer_metrics import FULL, promtool

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "ferret.json"
# Grafana's variables, as a query would see them.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$instance": ".*"}


def need_promtool() -> str:
    binary = promtool()
    if binary is None:
        pytest.skip("promtool is not installed (scripts/test.sh takes it from the platform's prometheus package)")
    return binary


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def queries() -> list[str]:
    board = dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    out = []
    for expr in exprs:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, f"an unknown Grafana variable in {expr}"
        out.append(expr)
    return out


def exported_names() -> set[str]:
    """Every sample name the trainer's endpoint serves with every optional family present."""
    metrics = TrainerMetrics()
    metrics.register(lambda: FULL, lambda: 1.5)
    port = metrics.serve(0)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line and not line.startswith("#")}


def test_the_scrape_config_passes_promtool_and_targets_the_compose_trainer() -> None:
    out = subprocess.run(
        [need_promtool(), "check", "config", str(MONITORING / "prometheus.yml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    trainer = load_settings(env=service_env(compose()["services"]["trainer"]))
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text(encoding="utf-8"))
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"trainer:{trainer.metrics.port}"]


def test_every_dashboard_query_parses_with_prometheus_own_parser(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"ferret:dashboard_query:{i}", "expr": expr} for i, expr in enumerate(queries())
    ]}]}  # fmt: skip
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    out = subprocess.run([need_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dashboard_reads_only_metrics_the_trainer_exports() -> None:
    exported = exported_names()
    read = {name for expr in queries() for name in re.findall(r"\b((?:ferret|process)_[a-z_]+)\b", expr)}
    assert read and not read - exported, f"the dashboard reads metrics nobody exports: {sorted(read - exported)}"
    families = {"ferret_online_accuracy_ratio", "ferret_prediction_latency_seconds_bucket", "ferret_skipped_total",
                "ferret_measured_bytes", "ferret_budget_bytes", "ferret_partition_lag_items",
                "ferret_replan_duration_seconds_bucket"}  # fmt: skip
    assert families <= read, f"the dashboard leaves out {sorted(families - read)}"


def test_the_dashboard_is_importable_and_every_panel_uses_the_datasource_variable() -> None:
    board = dashboard()
    assert board["uid"] == "ferret-trainer" and board["title"]
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "instance"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all('instance=~"$instance"' in t["expr"] for t in panel["targets"])
        assert panel["description"], f"{panel['title']}: say what the panel shows"


def test_the_compose_monitoring_profile_mounts_these_files() -> None:
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], f"{name} runs only with --profile monitoring"
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
    assert "trainer" in services["prometheus"]["depends_on"] and "prometheus" in services["grafana"]["depends_on"]
    datasource = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    published = {str(p).split(":")[-1] for p in services["prometheus"]["ports"]}
    assert source["url"] == "http://prometheus:9090" and "9090" in published
    provider = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/ferret.yml").read_text())
    mounted = {v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert provider["providers"][0]["options"]["path"] in mounted
