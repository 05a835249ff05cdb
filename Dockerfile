# velocity-tts on the NGC Triton image: the container's own tritonserver and python
# backend, CUDA torch, this package. Build and run:
#   docker build -t velocity-tts .
#   docker run --gpus all --shm-size 1g --stop-timeout 60 -p 8000-8003:8000-8003 -p 8080:8080 \
#       -v /path/to/ChatTTS:/weights:ro velocity-tts
# --stop-timeout: docker stop's default 10 s is shorter than the drain (DRAIN_TIMEOUT 20 +
# EXIT_TIMEOUT 30). Port 8003 answers readiness, 503 while draining (point probes there);
# 8080 is the OpenAI speech API and the web page (the gateway serve.sh starts beside Triton);
# for Home Assistant add -e WYOMING_PORT=10200 -p 10200:10200.
# (/path/to/ChatTTS is the folder holding the release's asset/ directory.)
# 24.10 ships Triton 2.51, the server the tests use from the pytriton wheel.
FROM nvcr.io/nvidia/tritonserver:24.10-py3

WORKDIR /opt/velocity-tts
# CUDA build of torch first (the image has CUDA 12.6; cu124 wheels run on it), so the
# package's unpinned `torch` requirement is already met.
RUN pip install --no-cache-dir torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
COPY pyproject.toml README.md ./
COPY velocity ./velocity
COPY client ./client
RUN pip install --no-cache-dir . "tritonclient[grpc,http]==2.51.0"
COPY model_repository ./model_repository
COPY scripts ./scripts

ENV VELOCITY_WEIGHTS=/weights
EXPOSE 8000 8001 8002 8003 8080 10200
# serve.sh finds the container's tritonserver on PATH, starts the gateway beside it, and on
# SIGTERM drains and stops both.
ENTRYPOINT ["bash", "scripts/serve.sh"]
CMD ["--weights", "/weights"]
