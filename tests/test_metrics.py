"""Processor metrics: values from a fresh registry, and scraped by a real Prometheus server."""

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
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rewardstream.commands.cli import main as cli_main
from rewardstream.commands.cli import ng_reward_profile
from rewardstream.contract.events import Topics
from rewardstream.kafka.local import free_port
from rewardstream.processors.core.confseq import Tally
from rewardstream.processors.core.difference import Rule
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.server import make_app, serve
from rewardstream.producers.events import input_events, rollout_events
from rewardstream.sinks.metrics import Metrics
from tests.golden import GOLDEN, file_events, generated_collection, golden_cases, golden_events
from tests.processes import Processor, make_topics, run_detail, send_events
from tests.test_live_compare import LONG, RUNS
from tests.test_live_compare import _collection as collection
from tests.test_poison import metrics as scraped

pytestmark = pytest.mark.skipif(not GOLDEN.exists(), reason="no goldens")
RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "rules.yml"


def _pipeline(tmp_path: Path) -> tuple[Pipeline, Metrics]:
    holder: dict[str, Pipeline] = {}
    metrics = Metrics(lambda: holder["p"].runs)
    pipeline = holder["p"] = Pipeline(tmp_path, metrics=metrics)
    case = next(c for c in golden_cases() if c.name == "multi_agent")
    events = golden_events(case, "m", finish=False)
    for kind, raw in events + events[:2]:  # two duplicates
        run = pipeline.handle(kind, raw)
        assert run is not None
    pipeline.handle("rollout", b"{bad")
    return pipeline, metrics


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_and_live_reward_stats(tmp_path: Path) -> None:
    pipeline, metrics = _pipeline(tmp_path)
    with pipeline:
        got = _samples(metrics)
        rows = [
            orjson.loads(x)
            for x in (GOLDEN / "edge_cases/multi_agent/rollouts.jsonl").read_bytes().splitlines()
        ]
        consumed = sum(
            v for (n, _), v in got.items() if n == "rewardstream_rollouts_consumed_total"
        )
        assert consumed == len(rows)
        assert got[("rewardstream_duplicates_dropped_total", (("kind", "input"),))] == 2
        rejected = (("kind", "rollout"), ("reason", "not-json"))
        assert got[("rewardstream_events_rejected_total", rejected)] == 1
        assert got[("rewardstream_run_completion_ratio", (("run_id", "m"),))] == 1.0
        by_agent: dict[str, list[float]] = {}
        for r in rows:
            by_agent.setdefault(r["agent_ref"]["name"], []).append(float(r["reward"]))
        for agent, rewards in by_agent.items():
            labels = (("agent", agent), ("run_id", "m"))
            assert got[("rewardstream_reward_mean", labels)] == pytest.approx(
                sum(rewards) / len(rewards)
            )
            assert got[("rewardstream_reward_max", labels)] == max(rewards)
        assert got[("rewardstream_publish_to_visible_seconds_count", ())] == len(rows)


@pytest.fixture
def prometheus_bin() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("prometheus is not installed (.ci/system-deps installs it)")
        pytest.skip("prometheus is not installed")
    return exe


@pytest.fixture
def prometheus(prometheus_bin: str, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real Prometheus scraping 127.0.0.1:<target> every second, evaluating the shipped rules
    (deploy/prometheus/rules.yml) every second; yields (its url, target)."""
    target, port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs: [{job_name: rewardstream, static_configs: "
        f"[{{targets: ['127.0.0.1:{target}']}}]}}]\n"
    )
    proc = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", target
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _query(url: str, promql: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(
        f"{url}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=5
    ) as r:
        body = orjson.loads(r.read())
    result: list[dict[str, object]] = body["data"]["result"]
    return result


@pytest.fixture
async def served(
    tmp_path: Path, prometheus: tuple[str, int]
) -> AsyncIterator[tuple[str, Pipeline]]:
    url, target = prometheus
    pipeline, metrics = _pipeline(tmp_path)
    runner, _ = await serve(make_app(pipeline, metrics.registry), "127.0.0.1", target)
    try:
        yield url, pipeline
    finally:
        await runner.cleanup()
        pipeline.close()


async def test_real_prometheus_scrapes_the_processor(served: tuple[str, Pipeline]) -> None:
    url, _ = served
    deadline = time.monotonic() + 60
    result: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        try:
            result = await asyncio.to_thread(
                _query, url, "sum(rewardstream_rollouts_consumed_total)"
            )
        except OSError:
            result = []
        if result:
            break
        await asyncio.sleep(0.5)
    assert result, "Prometheus never scraped the processor"
    value = result[0]["value"]
    assert isinstance(value, list) and float(value[1]) == 8.0
    means = await asyncio.to_thread(_query, url, 'rewardstream_reward_mean{run_id="m"}')
    assert {m["metric"]["agent"] for m in means} == {"alpha", "beta"}  # type: ignore[index]


def test_latency_notes_fold_into_cumulative_le_buckets() -> None:
    now = time.time()
    metrics = Metrics(dict, wall=lambda: now)  # a loaded machine's delays are not latencies
    ages = (0.001, 0.01, 0.2, 100.0)
    metrics.rollouts(["a"] * len(ages), [now - age for age in ages])
    got = _samples(metrics)
    bucket = "rewardstream_publish_to_visible_seconds_bucket"
    assert got[(bucket, (("le", "0.005"),))] == 1
    assert got[(bucket, (("le", "0.025"),))] == 2
    assert got[(bucket, (("le", "0.25"),))] == 3
    assert got[(bucket, (("le", "+Inf"),))] == 4
    assert got[("rewardstream_rollouts_consumed_total", (("agent", "a"),))] == 4


def _compared(tmp_path: Path) -> Pipeline:
    """A pipeline holding the runs ``rewardstream compare``'s tests build (open, in process)."""
    pipeline = Pipeline(tmp_path / "state")
    for run_id in ("base", "better", "worse", "same", "outside"):
        inputs, rollouts = collection(tmp_path / run_id, RUNS[run_id], [LONG])
        for event in [*input_events(inputs, run_id), *rollout_events(rollouts, run_id)]:
            pipeline.handle(event.kind, event.value)
    return pipeline


PAIRS = [("base", "better"), ("base", "worse"), ("base", "same"), ("base", "outside")]


async def test_compare_gauges_are_rewardstream_compares_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scraped from a real endpoint, each pair's difference, interval and verdict are those
    ``rewardstream compare --json`` shows against the same processor (1 better, -1 worse, NaN
    undecided; 0 under a noise floor wider than the interval); a run with a reward outside its
    range has a difference but no interval nor verdict; a pair with an unknown run, no series."""
    pipeline = _compared(tmp_path)
    wide = Rule(0.95, 1.0)
    apps = []
    for rule in (Rule(), wide):
        metrics = Metrics(lambda: pipeline.runs, compares=[*PAIRS, ("base", "nope")], rule=rule)
        apps.append(await serve(make_app(pipeline, metrics.registry, rule=rule), "127.0.0.1", 0))
    try:
        urls = [f"http://127.0.0.1:{port}" for _, port in apps]
        got, got_wide = [await asyncio.to_thread(scraped, url) for url in urls]
        for baseline, candidate in PAIRS:
            argv = ["compare", "--url", urls[0], "--baseline-run", baseline]
            argv += ["--candidate-run", candidate, "--once", "--json"]
            assert await asyncio.to_thread(cli_main, argv) == 0
            (row,) = orjson.loads(capsys.readouterr().out)["agents"]
            pair = (("agent", LONG), ("baseline", baseline), ("candidate", candidate))
            at = tuple(sorted((*pair, ("level", "0.95"))))
            assert got[("rewardstream_compare_difference", pair)] == row["difference"]
            if candidate == "outside":
                named = [name for name, labels in got if ("candidate", "outside") in labels]
                assert named == ["rewardstream_compare_difference"]
                continue
            assert got[("rewardstream_compare_difference_lower", at)] == row["lower"]
            assert got[("rewardstream_compare_difference_upper", at)] == row["upper"]
            verdict = got[("rewardstream_compare_verdict", (*at, ("noise_floor", "0.01")))]
            want = {"better": 1.0, "worse": -1.0, "undecided": math.nan}[row["verdict"]]
            assert verdict == want or (math.isnan(verdict) and math.isnan(want)), row
            said = got_wide[("rewardstream_compare_verdict", (*at, ("noise_floor", "1.0")))]
            assert said == 0.0  # an interval within [-1, 1]: no difference larger than 1
        assert not [k for k in got if ("candidate", "nope") in k[1]]
    finally:
        for runner, _ in apps:
            await runner.cleanup()
        pipeline.close()


def _alerts(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as r:
        alerts: list[dict[str, Any]] = orjson.loads(r.read())["data"]["alerts"]
    return alerts


async def test_a_real_prometheus_alerts_on_a_worse_candidate(
    tmp_path: Path, prometheus: tuple[str, int]
) -> None:
    """The shipped alert, evaluated by a real Prometheus scraping a processor given the pairs,
    fires for the worse candidate only (no ``for``: at once); better is selected by == 1."""
    url, target = prometheus
    pipeline = _compared(tmp_path)
    metrics = Metrics(lambda: pipeline.runs, compares=PAIRS)
    runner, _ = await serve(make_app(pipeline, metrics.registry), "127.0.0.1", target)
    try:
        deadline = time.monotonic() + 60
        firing: list[dict[str, Any]] = []
        while not firing:
            with contextlib.suppress(OSError):
                firing = [
                    a
                    for a in await asyncio.to_thread(_alerts, url)
                    if a["labels"]["alertname"] == "RewardstreamCandidateWorse"
                    and a["state"] == "firing"
                ]
            assert time.monotonic() < deadline, "the alert never fired"
            await asyncio.sleep(0.5)
        assert [(a["labels"]["baseline"], a["labels"]["candidate"]) for a in firing] == [
            ("base", "worse")
        ]
        better = await asyncio.to_thread(_query, url, "rewardstream_compare_verdict == 1")
        assert [m["metric"]["candidate"] for m in better] == ["better"]  # type: ignore[index]
    finally:
        await runner.cleanup()
        pipeline.close()


@pytest.mark.kafka
def test_every_processor_exports_the_whole_runs_comparison(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """Two processors given ``--compare a:b``, each holding half the partitions of two open
    runs, export the same difference of mean reward: the batch profiles' (their parts and the
    peer's member records, not their share)."""
    prefix = unique_name("cmp")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 4))
    hosts = [
        Processor(kafka_bootstrap, prefix, tmp_path / "out", tmp_path / f"p{i}.log",
                  extra=["--compare", "a:b"], private_disk=tmp_path / f"host{i}")
        for i in range(2)
    ]  # fmt: skip
    processors.extend(hosts)
    deadline = time.monotonic() + 60
    while sum(len(h.units()) for h in hosts) != 8 or not all(h.units() for h in hosts):
        assert time.monotonic() < deadline, [h.units() for h in hosts]
        time.sleep(0.2)
    batch = {}
    for run_id, seed in (("a", 1), ("b", 2)):
        inputs, rollouts = generated_collection(tmp_path / run_id, tasks=80, repeats=4, seed=seed)
        send_events(
            kafka_bootstrap, topics, file_events(inputs, rollouts, run_id, "r", False), run_id
        )
        rows = orjson.loads((tmp_path / run_id / "r_agent_metrics.json").read_bytes())
        batch[run_id] = {r["agent_ref"]["name"]: r["mean/reward"] for r in rows}
    want = {agent: batch["b"][agent] - batch["a"][agent] for agent in batch["a"]}
    name = "rewardstream_compare_difference"
    deadline = time.monotonic() + 60
    while True:
        shown = [
            {dict(labels)["agent"]: v for (n, labels), v in scraped(h.url).items() if n == name}
            for h in hosts
        ]
        if all(s.keys() == want.keys() for s in shown) and all(
            math.isclose(s[a], d, rel_tol=1e-9, abs_tol=1e-12)
            for s in shown
            for a, d in want.items()
        ):
            break
        assert time.monotonic() < deadline, (shown, want)
        time.sleep(0.3)


@pytest.mark.kafka
def test_a_processor_shows_and_writes_its_intervals_at_its_level(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """``rewardstream stream --level 0.9``: each agent's interval on ``/runs/<id>`` is at 0.9,
    the sequence of the sums it shows; ``/metrics`` exports it with ``level="0.9"``; the
    final's ``_intervals.json`` is the batch command's with ``+interval_level=0.9``."""
    prefix = unique_name("level")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 2))
    out = tmp_path / "out"
    extra = ["--level", "0.9", "--aggregate-metrics"]
    p = Processor(kafka_bootstrap, prefix, out, tmp_path / "p.log", extra=extra)
    processors.append(p)
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=60, repeats=4, seed=5)
    send_events(kafka_bootstrap, topics, file_events(inputs, rollouts, "lv", "r", True), "lv")
    p.wait(lambda runs: runs.get("lv", {}).get("state") == "final")
    detail, shown = run_detail(p.url, "lv"), scraped(p.url)
    assert len(detail["agents"]) == 3
    for agent, figures in detail["agents"].items():
        interval = figures["reward"]["interval"]
        (lo, hi), (n, total, spread) = interval["range"], interval["sums"]
        now = Tally(lo, hi, n, total, spread, interval["outside"]).interval(0.9)
        assert now is not None and interval["level"] == 0.9
        assert (interval["lower"], interval["upper"]) == (now.lower, now.upper)
        for side in ("lower", "upper"):
            labels = (("agent", agent), ("level", "0.9"), ("run_id", "lv"))
            assert shown[(f"rewardstream_reward_mean_{side}", labels)] == interval[side]
    argv = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    more = ["+quiet=true", "+aggregate_metrics=true", "+interval_level=0.9"]
    assert ng_reward_profile([*argv, *more]) == 0
    written = (out / "lv" / "r_intervals.json").read_bytes()
    assert written == (tmp_path / "data" / "r_intervals.json").read_bytes()
    assert orjson.loads(written)["level"] == 0.9
