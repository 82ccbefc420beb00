"""The monitoring files under deploy/ are valid and do what they say: Prometheus's own
``promtool`` checks the scrape config and the rules, and runs the rules' unit tests (each
recording rule and alert, deploy/prometheus/rules.test.yml)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from rewardstream.contract import Topics
from rewardstream.kafka_local import free_port
from tests.golden import file_events, generated_collection
from tests.processes import Processor, make_topics, send_events

PROMETHEUS = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
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
def test_promtool(argv: list[str]) -> None:
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, *argv], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


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
    two processors of one group; the recording rules give each agent's mean and std over the
    whole run, equal to the batch profile's."""
    prometheus_bin = shutil.which("prometheus")
    assert prometheus_bin is not None
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=300, repeats=4, seed=3)
    prefix = unique_name("prom")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 4))
    log = tmp_path / "processors.log"
    members = [Processor(kafka_bootstrap, prefix, tmp_path / "out", log) for _ in range(2)]
    processors.extend(members)
    send_events(kafka_bootstrap, topics, file_events(inputs, rollouts, "run", "r", True), "run")
    for member in members:
        member.wait(lambda runs: runs.get("run", {}).get("done") is True)

    config = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS, config)
    text = (config / "prometheus.yml").read_text()
    (config / "prometheus.yml").write_text(
        text.replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("evaluation_interval: 15s", "evaluation_interval: 1s")
        .replace("refresh_interval: 30s", "refresh_interval: 1s")
    )
    targets = [m.url.removeprefix("http://") for m in members]
    (config / "targets" / "processors.json").write_text(
        orjson.dumps([{"targets": targets}]).decode()
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={config / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        batch = {
            e["agent_ref"]["name"]: e
            for e in orjson.loads((tmp_path / "data" / "r_agent_metrics.json").read_bytes())
        }
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(OSError):
                up = _query(url, 'count(up{job="rewardstream"} == 1)')
                means = _query(url, 'rewardstream:reward_mean{run_id="run"}')
                if up and up[0]["value"][1] == "2" and len(means) == len(batch):
                    break
            assert time.monotonic() < deadline, "Prometheus never scraped both processors"
            time.sleep(0.5)
        stds = _query(url, 'rewardstream:reward_std{run_id="run"}')
        for series, stat in ((means, "mean/reward"), (stds, "std/reward")):
            got = {s["metric"]["agent"]: float(s["value"][1]) for s in series}
            want = {agent: entry[stat] for agent, entry in batch.items()}
            assert got.keys() == want.keys()
            for agent, value in want.items():
                assert math.isclose(got[agent], value, rel_tol=1e-9), (stat, agent)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
