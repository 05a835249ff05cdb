"""deploy/kubernetes renders (kustomize, through kubectl) and validates offline against the
Kubernetes schemas (kubernetes-validate), for the default CPU layout and the GPU and download
overlays; the manifests agree with serve.sh, Settings and the metrics they name; the Grafana
dashboard queries only series the server exports; the Dockerfile passes hadolint."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from triton_server import ROOT
from velocity.serving.metrics import LLM, VOCODER
from velocity.serving.settings import Settings

K8S = ROOT / "deploy" / "kubernetes"
LAYOUTS = ["base", "overlays/gpu", "overlays/download"]
GPU_ONLY = {"nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"}  # Triton exports these on GPU servers only


def kubectl() -> str:
    exe = shutil.which("kubectl")
    assert exe, "kubectl is needed to render the manifests: scripts/setup.sh --test-tools installs Debian's kubernetes-client"
    return exe


def render(layout: str) -> list[dict]:
    out = subprocess.run([kubectl(), "kustomize", str(K8S / layout)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def deployment(docs: list[dict]) -> dict:
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    return dep


def serve_default(name: str) -> int:
    """A port's default in scripts/serve.sh (NAME="${NAME:-8000}")."""
    m = re.search(rf'^{name}="\$\{{{name}:-(\d+)\}}"', (ROOT / "scripts" / "serve.sh").read_text(), re.M)
    assert m, name
    return int(m.group(1))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_manifests_render_and_validate(layout):
    docs = render(layout)
    version = kubernetes_validate.latest_version()
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)     # raises naming the field
    kinds = sorted(d["kind"] for d in docs)
    want = ["Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "PodDisruptionBudget", "Service", "Service",
            "Service"]
    assert kinds == sorted(want + ([] if layout == "overlays/download" else ["PersistentVolumeClaim"]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_deployment_fits_serve_sh_and_the_settings(layout):
    dep = deployment(render(layout))
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    # the grace period covers preStop, the drain and the exit
    pre = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= pre + int(env["DRAIN_TIMEOUT"]) + int(env["EXIT_TIMEOUT"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": serve_default("HTTP_PORT"), "grpc": serve_default("GRPC_PORT"),
                     "metrics": serve_default("METRICS_PORT"), "health": serve_default("HEALTH_PORT"),
                     "gateway": serve_default("GATEWAY_PORT")}
    assert int(env["GATEWAY_PORT"]) == ports["gateway"]
    # readiness and liveness on serve.sh's health port (drains and dead parts); a restart after a
    # death may take as long as the first load, which the startup probe allows: the liveness
    # probe fails only once the server has not been ready for longer
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "health"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "health"}
    startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert int(env.get("LIVE_GRACE", serve_default("LIVE_GRACE"))) >= startup
    # every VELOCITY_* variable is a setting
    names = {f.name.upper() for f in fields(Settings)}
    assert {k for k in env if k.startswith("VELOCITY_")} <= {f"VELOCITY_{n}" for n in names}
    assert pod["securityContext"]["runAsNonRoot"] is True
    (weights,) = [m for m in c["volumeMounts"] if m["name"] == "weights"]
    assert weights["mountPath"] == "/weights" and weights["readOnly"] is True
    gpu = c["resources"]["limits"].get("nvidia.com/gpu")
    assert (gpu == "1") == (layout == "overlays/gpu")
    assert (env.get("VELOCITY_DEVICE") == "cuda") == (layout == "overlays/gpu")
    if layout == "overlays/download":
        (init,) = pod["initContainers"]
        script = ROOT / init["command"][1]
        assert script.name == "download_weights.py" and script.exists()
        assert init["command"][-2:] == ["--out", weights["mountPath"]]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_clients_reach_only_the_client_ports_and_the_rest_stays_in_the_namespace(layout):
    """The NetworkPolicy selects the replicas and names every port once: the gateway, gRPC and
    HTTP open to any peer, metrics and readiness to this namespace's pods alone; the Service that
    clients use publishes only the client ports; the image listens on every interface (BIND)."""
    docs = render(layout)
    dep = deployment(docs)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items() and spec["policyTypes"] == ["Ingress"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    opened = {}
    for rule in spec["ingress"]:
        for p in rule["ports"]:
            assert p["port"] not in opened, p
            opened[p["port"]] = rule.get("from")
    assert set(opened) == {p["name"] for p in c["ports"]}
    clients = {"gateway", "grpc", "http"}
    assert all(opened[p] is None for p in clients)                     # no `from`: any peer
    assert all(opened[p] == [{"podSelector": {}}] for p in set(opened) - clients)   # this namespace's pods
    (public,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("velocity-tts")]
    assert {p["targetPort"] for p in public["spec"]["ports"]} == clients
    assert re.search(r"^ENV BIND=0\.0\.0\.0$", (ROOT / "Dockerfile").read_text(), re.M)


def test_the_autoscaler_scales_on_a_gauge_the_llm_exports():
    docs = render("base")
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    exported = {v[0]: v[2] for v in LLM.values()}
    assert exported.get(name) == "GAUGE", f"{name} is not a gauge of the llm: {exported}"
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment(docs)["metadata"]["name"]
    adapter = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = adapter["rules"]["custom"]
    assert rule["seriesQuery"].startswith(name + "{") and rule["name"]["as"] == name
    env = {e["name"]: e["value"] for e in deployment(docs)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert float(metric["pods"]["target"]["averageValue"]) < int(env["VELOCITY_MAX_CONCURRENT_REQUESTS"])


@pytest.mark.server
def test_the_dashboard_queries_only_exported_series(tts_server):
    dash = json.loads((K8S / "grafana" / "velocity-tts.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:velocity|nv)_[a-z_]+)", e)}
    ours = {v[0] for v in [*LLM.values(), *VOCODER.values()]}
    ours |= {f"{n}_{s}" for n in ours for s in ("bucket", "sum", "count")}
    served = set(re.findall(r"^(nv_[a-z_]+)", tts_server.metrics(), re.M))
    missing = {m for m in used if m not in ours and m not in served and m not in GPU_ONLY}
    assert not missing, f"the dashboard queries series nobody exports: {missing}"
    for want in ("velocity_time_to_first_chunk_seconds_bucket", "velocity_request_rtf_bucket",
                 "velocity_kv_blocks_used", "velocity_preemptions_total", "velocity_refused_requests_total"):
        assert want in used, want


def test_the_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    out = subprocess.run([str(hadolint), str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER [1-9]", text, re.M), "the image runs as a non-root user"
    assert "HEALTHCHECK" in text and ":8003/v2/health/ready" in text
    exposed = {int(p) for p in re.search(r"^EXPOSE (.*)$", text, re.M).group(1).split()}
    assert {serve_default(n) for n in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "HEALTH_PORT", "GATEWAY_PORT")} <= exposed
