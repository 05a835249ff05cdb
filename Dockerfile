# velocity-tts on the NGC Triton image: the container's own tritonserver and python backend,
# CUDA torch, this package and the OpenAI gateway, run as a non-root user. Build and run:
#   docker build -t velocity-tts .
#   docker run --gpus all --shm-size 1g --stop-timeout 70 -p 8000-8003:8000-8003 -p 8080:8080 \
#       -v /path/to/ChatTTS:/weights:ro velocity-tts
# --stop-timeout: docker stop's default 10 s is shorter than the drain (DRAIN_TIMEOUT 20 +
# EXIT_TIMEOUT 30). Port 8003 answers readiness, 503 while draining (point probes and
# balancers there); 8080 is the OpenAI speech API and the web page; for Home Assistant add
# -e WYOMING_PORT=10200 -p 10200:10200. /path/to/ChatTTS is the folder holding the release's
# asset/ directory, mounted read-only. Kubernetes: deploy/kubernetes and docs/deploy.md.
#
# 26.09 ships Triton 2.73 (Ubuntu 24.04, Python 3.12, CUDA 13). Fixes since 24.10 that a
# streaming server meets: the gRPC segfault on cancellation (24.12), stubs left as zombies
# under load (25.04), a race in concurrent streaming responses on cancellation (26.03), the
# python backend's shutdown segfault with metrics and its shared-memory cleanup (26.09).
# The tests run on 2.51 from the pytriton wheel; docs/deploy.md lists what differs by version.
# This image was not built in the project's CI (no Docker engine there): see docs/deploy.md.
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:26.09-py3
FROM ${TRITON_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG TORCH_SPEC="torch==2.11.0"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130
WORKDIR /opt/velocity-tts
# A venv over the image's Python (whose libpython the stub embeds): serve.sh puts its bin/
# first on PATH, where the python stub finds these packages. CUDA torch first, so the
# package's unpinned `torch` requirement is already met.
RUN python3 -m venv --system-site-packages .venv \
    && .venv/bin/pip install --no-cache-dir "${TORCH_SPEC}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY velocity ./velocity
COPY client ./client
RUN .venv/bin/pip install --no-cache-dir ".[engine,gpu,gateway,client]" "tritonclient[grpc,http]==2.51.0"
COPY model_repository ./model_repository
COPY scripts ./scripts

RUN useradd --create-home --uid 1000 --user-group velocity
USER 1000:1000
ENV VELOCITY_WEIGHTS=/weights
# every interface: a container's loopback is its own (docker run -p decides what is published)
ENV BIND=0.0.0.0
VOLUME ["/weights"]
EXPOSE 8000 8001 8002 8003 8080 10200
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
    CMD ["/opt/velocity-tts/.venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8003/v2/health/ready', timeout=2)"]
# serve.sh finds the container's tritonserver on PATH, starts the gateway beside it, and on
# SIGTERM drains and stops both.
ENTRYPOINT ["bash", "scripts/serve.sh"]
CMD ["--weights", "/weights"]
