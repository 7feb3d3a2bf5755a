# Ferret's one image: `ferret run` (trainer), `ferret produce`, `ferret control` ... (ENTRYPOINT ferret).
#
# CPU image (the default; torch from the PyTorch CPU index, since the registry's default torch is a
# multi-GB CUDA build):
#   docker build -t ferret:0.1.0 .
# CUDA image (k8s/components/gpu expects the name ferret-cuda; pick the cuXXX index that publishes
# torch 2.13.0 for your driver):
#   docker build -t ferret-cuda:0.1.0 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu130 .
#
# Production contents: the services' dependencies only. The demo's embedded broker and Redis, matplotlib
# and scikit-learn are the `demo` extra and stay out; FERRET_EXTRAS=digits adds scikit-learn for the
# bundled `digits` stream (docker-compose.yml builds it so). Your own model's packages (e.g. torchvision,
# from TORCH_INDEX so it matches torch's CUDA) go in with TORCH_PACKAGES="torch==2.13.0 torchvision==..."
# or a derived image (docs/your-model.md).
#
# No HEALTHCHECK: compose and Kubernetes probe the trainer's grpc.health.v1 service (docs/deploy.md), and
# the same image also runs one-shot commands that serve nothing.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Keep the torch pin equal to pyproject.toml's (tests/unit/test_deploy_manifests.py checks it).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_PACKAGES="torch==2.13.0"
ARG FERRET_EXTRAS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:${PATH}
# torch first, from TORCH_INDEX only; the project's own `torch==2.13.0` is then already satisfied
# (2.13.0+cpu matches ==2.13.0) and pip takes nothing from the registry for it. The pins are in
# TORCH_PACKAGES and pyproject.toml, which hadolint's DL3013 cannot see through.
# hadolint ignore=DL3013
RUN python -m venv /opt/venv \
    && pip install --index-url "${TORCH_INDEX}" ${TORCH_PACKAGES}
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY ferret_core ./ferret_core
COPY services ./services
# hadolint ignore=DL3013
RUN pip install ".${FERRET_EXTRAS:+[${FERRET_EXTRAS}]}" \
    && pip check \
    && python -c "import torch, ferret_core, services.cli.main; print('torch', torch.__version__)"

FROM ${PYTHON_IMAGE} AS runtime
# 10001: the numeric user the Kubernetes manifests name in runAsUser (runAsNonRoot needs a numeric USER).
# /var/lib/ferret: the user's own state folder; a volume mounted there starts owned by it (the compose
# stack keeps its generated snapshot signing key there).
RUN groupadd --system --gid 10001 ferret \
    && useradd --system --uid 10001 --gid ferret --home-dir /home/ferret --create-home \
       --shell /usr/sbin/nologin ferret \
    && install -d -m 0700 -o ferret -g ferret /var/lib/ferret
COPY --from=build /opt/venv /opt/venv
COPY config/ferret.example.yaml /etc/ferret/ferret.example.yaml
# Caches go to /tmp: the root filesystem is read-only under Kubernetes (an emptyDir is mounted on /tmp).
# No FERRET_* setting is baked in: the environment wins over the config file, so an image default would
# silently override a mounted ferret.yaml. compose and k8s set the container addresses themselves.
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    XDG_CACHE_HOME=/tmp/.cache
USER 10001:10001
WORKDIR /home/ferret
# 50051: gRPC control plane + grpc.health.v1 + reflection; 9100: Prometheus metrics.
EXPOSE 50051 9100
ENTRYPOINT ["ferret"]
CMD ["--help"]
