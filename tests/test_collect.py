"""``ng_collect_rollouts``: materialization goldens, real servers, failures, resume, Kafka."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from rewardstream.commands.cli import ng_reward_profile
from rewardstream.contract.events import Topics
from rewardstream.infra.overrides import parse_overrides
from rewardstream.kafka.local import free_port
from rewardstream.processors.http.page import LiveView
from rewardstream.processors.stream import StreamProcessor
from rewardstream.producers.gym.collect import CollectConfig, CollectionFailed, collect, main, run
from rewardstream.producers.gym.materialize import materialize
from rewardstream.producers.publisher.run_id import default_run_id
from tests.golden import GOLDEN, OUTPUT_SUFFIXES
from tests.gym import (
    POLICY,
    NgRun,
    fast,
    keys,
    ng_run,
    read_jsonl,
    serve,
    streaming,
    write_problems,
)

needs_golden = pytest.mark.skipif(not GOLDEN.exists(), reason="no goldens")

# golden/README.md: the parameters that reproduce each set's committed materialized inputs
GOLDEN_PARAMS = {
    "blackjack": [
        "+responses_create_params.max_output_tokens=1024",
        "+responses_create_params.temperature=0.0",
    ],
    "circle_click": ["+agent_name=circle_click_simple_agent"],
    "asr_with_pc": [
        "+agent_name=asr_with_pc_simple_agent",
        "+responses_create_params.temperature=1.0",
        "+responses_create_params.top_p=0.95",
        "+responses_create_params.max_output_tokens=4096",
    ],
    "longmt_eval": [
        "+agent_name=longmt_pg19_agent",
        "+responses_create_params.max_output_tokens=30000",
        "+responses_create_params.temperature=0.0",
    ],
}


def _collect(inputs: Path, out: Path, *extra: str) -> int:
    return main([f"+input_jsonl_fpath={inputs}", f"+output_jsonl_fpath={out}", *extra])


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, *parts: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------- materialization


@needs_golden
@pytest.mark.parametrize("name", list(GOLDEN_PARAMS))
def test_materialized_inputs_equal_nemo_gym(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As with NeMo Gym, the materialized file is written before the servers are needed."""
    upstream = GOLDEN / name / "upstream"
    out = tmp_path / "example_rollouts.jsonl"
    code = _collect(
        upstream / "example.jsonl",
        out,
        *GOLDEN_PARAMS[name],
        f"+head_server_url=http://127.0.0.1:{free_port()}",
    )
    _one_line_error(capsys, code, "Could not connect to the head server")
    written = (tmp_path / "example_rollouts_materialized_inputs.jsonl").read_bytes()
    expected = (upstream / "example_rollouts_materialized_inputs.jsonl").read_bytes()
    if name != "longmt_eval":
        assert written == expected
        return
    # longmt_eval's committed rows came from a larger input (task indices 28, 142, ...) and were
    # written in Python-json style; everything else matches, key order included.
    ours = [orjson.loads(line) for line in written.splitlines()]
    theirs = [orjson.loads(line) for line in expected.splitlines()]
    assert [r["_ng_task_index"] for r in ours] == [0, 1, 2, 3, 4]
    for row, committed in zip(ours, theirs, strict=True):
        committed["_ng_task_index"] = row["_ng_task_index"]
        assert orjson.dumps(row) == orjson.dumps(committed)


def test_repeats_seeds_and_identical_lines(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    rows = [
        {"responses_create_params": {"input": "a", "metadata": {"extra_body": '{"k": 1}'}}},
        {"responses_create_params": {"input": "b"}, "_ng_task_index": 7},
        {"responses_create_params": {"input": "a", "metadata": {"extra_body": '{"k": 1}'}}},
    ]
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    cfg = CollectConfig.model_validate(
        {
            "input_jsonl_fpath": src,
            "output_jsonl_fpath": tmp_path / "o.jsonl",
            "agent_name": "x",
            "num_repeats": 2,
            "num_repeats_add_seed": True,
            "responses_create_params": {"temperature": 0.1},
        }
    )
    out = materialize(src, cfg)
    assert keys(out) == [(0, 0), (0, 1), (7, 0), (7, 1), (0, 2), (0, 3)]
    assert out[1]["responses_create_params"] == {
        "input": "a",
        "metadata": {"extra_body": '{"k": 1, "seed": 1}'},
        "temperature": 0.1,
    }
    assert out[2]["responses_create_params"]["metadata"] == {"extra_body": '{"seed": 0}'}
    assert list(out[2]) == [
        "responses_create_params",
        "_ng_task_index",
        "agent_ref",
        "_ng_rollout_index",
    ]
    assert out[0]["agent_ref"] == {"name": "x"}


def test_agent_map_and_interleaving(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    rows = [
        {"responses_create_params": {"input": "a"}, "agent_ref": {"type": "t", "name": "old"}},
        {"responses_create_params": {"input": "b"}, "agent_ref": {"name": "keep"}},
    ]
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    options: dict[str, Any] = {"input_jsonl_fpath": src, "output_jsonl_fpath": tmp_path / "o.jsonl"}
    options |= {"agent_map": {"old": "new"}, "num_repeats": 2, "interleave_repeats": True}
    out = materialize(src, CollectConfig.model_validate(options))
    assert keys(out) == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [r["agent_ref"] for r in out[:2]] == [{"name": "new"}, {"name": "keep"}]
    with pytest.raises(ValueError, match=r"conflicts with agent_map\._default"):
        CollectConfig.model_validate(options | {"agent_name": "a", "agent_map": {"_default": "b"}})


@pytest.mark.parametrize(
    ("content", "extra", "parts"),
    [
        (
            b'{"responses_create_params": {}}\n{"a": \n',
            ["+agent_name=a"],
            ["Malformed JSON in", "at line 2"],
        ),
        (
            b'{"responses_create_params": {}}\n\n',
            ["+agent_name=a"],
            ["at line 2", "input data is empty"],
        ),
        (b"[1]\n", ["+agent_name=a"], ["line 1: not a JSON object"]),
        (b'{"x": 1}\n', ["+agent_name=a"], ["line 1: missing field 'responses_create_params'"]),
        (b'{"responses_create_params": {}}\n', [], ["No agent specified for rows [0]"]),
        (
            b'{"responses_create_params": {}}\n',
            ["+agent_name=a", "+num_repeats=0"],
            ["num_repeats must be >= 1, got 0"],
        ),
        (
            b'{"responses_create_params": {}}\n',
            ["+agent_name=a", "+bogus=1"],
            ["invalid configuration 'bogus'"],
        ),
        (
            b'{"responses_create_params": {}}\n',
            ["+agent_name=a", "+num_repeat=4"],
            ["invalid configuration 'num_repeat': no such key (did you mean 'num_repeats'?)"],
        ),
        (
            b'{"responses_create_params": {}}\n',
            ["+agent_name=a", "+num_repeats=four"],
            ["'num_repeats': expected a whole number or a mapping ({key: value}), got 'four'"],
        ),
        (
            b'{"responses_create_params": {}}\n',
            ["+agent_name=a", "+num_samples_in_parallel=1.5"],
            ["'num_samples_in_parallel': expected a whole number, got 1.5"],
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    extra: list[str],
    parts: list[str],
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    out = tmp_path / "out" / "r.jsonl"
    _one_line_error(capsys, _collect(src, out, *extra), *parts)
    assert src.read_bytes() == content
    assert not (tmp_path / "out" / "r_materialized_inputs.jsonl").exists()


def test_missing_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = _collect(tmp_path / "nope.jsonl", tmp_path / "r.jsonl", "+agent_name=a")
    _one_line_error(capsys, code, "Input file not found", "(--input)")


# --------------------------------------------------------------------------- real servers


@pytest.fixture(scope="module")
def servers() -> Iterator[NgRun]:
    with ng_run(*fast()) as run:
        yield run


def _profile_equals_batch(profiles: Path, data: Path, stem: str, work: Path) -> None:
    """The three files in ``profiles`` equal ng_reward_profile's on copies of ``data``'s two."""
    batch = work / "batch"
    batch.mkdir(parents=True)
    for name in (f"{stem}.jsonl", f"{stem}_materialized_inputs.jsonl"):
        shutil.copy(data / name, batch / name)
    inputs, rollouts = batch / f"{stem}_materialized_inputs.jsonl", batch / f"{stem}.jsonl"
    args = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}"]
    assert ng_reward_profile([*args, "+quiet=true"]) == 0
    for suffix in OUTPUT_SUFFIXES:
        name = f"{stem}{suffix}"
        assert (profiles / name).read_bytes() == (batch / name).read_bytes(), name


def test_end_to_end_with_repeats_and_parallelism(
    servers: NgRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 40)
    out = tmp_path / "out" / "r.jsonl"
    args = ["+num_repeats=3", "+num_samples_in_parallel=8", "+num_repeats_add_seed=true"]
    args += [f"+head_server_url={servers.head_url}", "+responses_create_params.temperature=1.0"]
    assert _collect(src, out, *args) == 0
    stdout = capsys.readouterr().out
    assert "Finished rollout collection!" in stdout and f"Rollouts: {out}" in stdout
    inputs = read_jsonl(tmp_path / "out" / "r_materialized_inputs.jsonl")
    results = read_jsonl(out)
    assert len(inputs) == 120 and sorted(keys(results)) == sorted(keys(inputs))
    assert (tmp_path / "out" / "r_failures.jsonl").read_bytes() == b""
    for result in results:  # through the environment server, stamped last as 0.7.0 does
        assert result["reward"] in (0.0, 1.0) and result["agent_ref"]["name"]
        assert list(result)[-2:] == ["_ng_environment_server", "_ng_result_type"]
        assert result["_ng_environment_server"] == "arithmetic_environment_server"
        assert result["_ng_result_type"] == "legacy_agent"
    raw = (tmp_path / "out" / "r_aggregate_metrics.json").read_bytes()
    aggregate = orjson.loads(raw)
    assert not raw.endswith(b"\n")  # as 0.7.0 writes it
    assert list(aggregate[0]) == [  # 0.7.0's keys and order (no perf_summary: none measured)
        "agent_ref",
        "_ng_environment_server",
        "agent_metrics",
        "key_metrics",
        "group_level_metrics",
        "repeat_level_metrics",
    ]
    assert aggregate[0]["agent_ref"] == {"name": "arithmetic_simple_agent"}
    assert aggregate[0]["_ng_environment_server"] == "arithmetic_environment_server"
    assert aggregate[0]["agent_metrics"]["num_repeats"] == 3

    again = tmp_path / "again" / "r.jsonl"  # seeded: the same rewards for the same keys
    assert _collect(src, again, *args) == 0
    rewards = {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in results}
    assert rewards == {
        (r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in read_jsonl(again)
    }
    assert 0 < sum(rewards.values()) < len(rewards)


@pytest.fixture(scope="module")
def slow_servers() -> Iterator[NgRun]:
    with ng_run(f"{POLICY}.latency_s=0.05", f"{POLICY}.seconds_per_token=0") as run:
        yield run


def test_resume_after_the_collector_is_killed(
    slow_servers: NgRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_problems(tmp_path / "problems.jsonl", 60)
    out = tmp_path / "r.jsonl"
    args = [f"+input_jsonl_fpath={src}", f"+output_jsonl_fpath={out}", "+num_repeats=2"]
    args += ["+num_samples_in_parallel=4", f"+head_server_url={slow_servers.head_url}"]
    child = subprocess.Popen(
        [sys.executable, "-m", "rewardstream.producers.gym.collect", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not out.exists() or out.read_bytes().count(b"\n") < 20:
            assert child.poll() is None, "the collector finished before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    inputs = tmp_path / "r_materialized_inputs.jsonl"
    materialized = inputs.read_bytes()
    run_id = default_run_id(inputs, "r")  # what the killed collection's events carried
    done_before = out.read_bytes()
    assert 20 <= done_before.count(b"\n") < 120
    with out.open("ab") as fh:  # what a kill in the middle of a write leaves behind
        fh.write(b'{"responses_create_params":{"input":"cut sh')

    report = run(parse_overrides([*args, "+resume_from_cache=true"]))
    assert "Dropped a truncated final line" in capsys.readouterr().err
    assert inputs.read_bytes() == materialized  # read back, not re-expanded
    assert report.run_id == run_id  # the resumed collection is the same run
    results = read_jsonl(out)
    assert out.read_bytes().startswith(done_before)
    assert len(results) == 120 and sorted(keys(results)) == sorted(keys(read_jsonl(inputs)))
    strict = [f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={out}"]
    assert ng_reward_profile([*strict, "+quiet=true"]) == 0  # every rollout is there


# --------------------------------------------------------------------------- failures


class FakeAgent:
    """A real tiny aiohttp agent whose ``/run`` misbehaves as told."""

    def __init__(self, behaviour: Callable[[dict[str, Any], int], web.Response]) -> None:
        self.behaviour = behaviour
        self.calls: dict[tuple[int, int], int] = {}

    async def run(self, request: web.Request) -> web.Response:
        row = orjson.loads(await request.read())
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        self.calls[key] = self.calls.get(key, 0) + 1
        return self.behaviour(row, self.calls[key])


@pytest.fixture
async def fake_agent() -> AsyncIterator[Callable[[Callable[..., web.Response]], Any]]:
    runners: list[web.AppRunner] = []

    async def start(behaviour: Callable[[dict[str, Any], int], web.Response]) -> Any:
        agent = FakeAgent(behaviour)
        runner, url = await serve({"/run": agent.run})
        runners.append(runner)
        return agent, url

    yield start
    for runner in runners:
        await runner.cleanup()


def _config(tmp_path: Path, agent_url: str, **extra: Any) -> CollectConfig:
    src = write_problems(tmp_path / "problems.jsonl", 4)
    return CollectConfig.model_validate(
        {
            "input_jsonl_fpath": src,
            "output_jsonl_fpath": tmp_path / "r.jsonl",
            "agent_url": agent_url,
            "retry_backoff_s": 0.01,
            "quiet": True,
        }
        | extra
    )


def _ok(row: dict[str, Any]) -> web.Response:
    return web.json_response({"response": {}, "reward": 1.0} | row)


async def test_a_server_returning_500_never_becomes_a_reward(
    fake_agent: Any, tmp_path: Path
) -> None:
    agent, url = await fake_agent(lambda row, n: web.Response(status=500, text="boom"))
    cfg = _config(tmp_path, url, num_repeats=2)
    with pytest.raises(CollectionFailed, match="None of the 8 dispatched rollouts"):
        await collect(cfg)
    assert (tmp_path / "r.jsonl").read_bytes() == b""
    failures = read_jsonl(tmp_path / "r_failures.jsonl")
    assert len(failures) == 8 * 3 and set(agent.calls.values()) == {3}
    for failure in failures:
        assert failure["_ng_failure_class"] == "agent_run_error"
        assert failure["_ng_failure_http_status"] == 500
        assert failure["_ng_failure_response_body"] == "boom"
        assert failure["_ng_failure_terminal"] is False and "reward" not in failure
    attempts = sorted(f.get("_ng_attempt_index", 0) for f in failures if keys([f]) == [(0, 0)])
    assert attempts == [0, 1, 2]

    # a resume does not retry rows that used their attempts
    report = await collect(cfg.model_copy(update={"resume_from_cache": True}))
    assert (report.completed, report.failed) == (0, 0) and set(agent.calls.values()) == {3}


async def test_flaky_server_is_retried_and_recorded(fake_agent: Any, tmp_path: Path) -> None:
    def flaky(row: dict[str, Any], n: int) -> web.Response:
        return web.Response(status=503) if n == 1 else _ok(row)

    _, url = await fake_agent(flaky)
    report = await collect(_config(tmp_path, url))
    assert (report.completed, report.failed) == (4, 4)
    results = read_jsonl(tmp_path / "r.jsonl")
    assert {r["_ng_attempt_index"] for r in results} == {1}
    assert all(r["reward"] == 1.0 for r in results)
    assert len(read_jsonl(tmp_path / "r_failures.jsonl")) == 4


@pytest.mark.kafka
async def test_failed_attempts_are_streamed_and_counted_once(
    fake_agent: Any,
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every sidecar row is an ``attempt_failed`` event: the processor counts them per agent
    and class, and the page shows the failure rate."""

    def flaky(row: dict[str, Any], n: int) -> web.Response:
        return web.Response(status=503) if n == 1 else _ok(row)

    _, url = await fake_agent(flaky)
    async with streaming(kafka_bootstrap, tmp_path / "profiles", unique_name("failed")) as (
        processor,
        kafka,
    ):
        cfg = _config(tmp_path, url, **kafka)
        report = await collect(cfg)
        assert (report.completed, report.failed) == (4, 4)
        first = capsys.readouterr().err.splitlines()[0]  # a new folder: nothing is moved aside
        assert first.startswith(f"rewardstream: streaming run {report.run_id} to Kafka")
        assert first.endswith(
            "; live page: no processor is serving these topics yet (any one's --http address)"
        )
        run = processor.pipeline.runs[report.run_id]
        agent = "arithmetic_simple_agent"
        assert run.failures == {agent: {"agent_run_error": 4}}
        view = LiveView(processor.pipeline).detail(run)
        assert (view["failed_attempts"], view["failure_rate"]) == (4, 0.5)
        assert view["agents"][agent]["failed_attempts"] == {"agent_run_error": 4}
        assert view["agents"][agent]["failure_rate"] == 0.5


async def test_run_id_names_the_collection(fake_agent: Any, tmp_path: Path) -> None:
    """A resume keeps the run id, and ``rewardstream publish`` of the files derives the same
    one; a new collection written to the same path is a new run."""
    _, url = await fake_agent(lambda row, n: _ok(row))
    cfg = _config(tmp_path, url)
    first = await collect(cfg)
    inputs = tmp_path / "r_materialized_inputs.jsonl"
    assert first.run_id == default_run_id(inputs, "r")
    resumed = await collect(cfg.model_copy(update={"resume_from_cache": True}))
    assert resumed.cached == 4 and resumed.run_id == first.run_id
    again = await collect(cfg)
    assert again.completed == 4 and again.run_id != first.run_id
    assert again.run_id == default_run_id(inputs, "r")
    named = await collect(cfg.model_copy(update={"kafka_run_id": "mine"}))
    assert named.run_id == "mine"


async def test_any_file_name_works_without_kafka(fake_agent: Any, tmp_path: Path) -> None:
    """Run ids and stems are checked only when events are published."""
    _, url = await fake_agent(lambda row, n: _ok(row))
    cfg = _config(tmp_path, url)
    report = await collect(cfg.model_copy(update={"output_jsonl_fpath": tmp_path / "my run.jsonl"}))
    assert report.completed == 4 and (tmp_path / "my run_materialized_inputs.jsonl").exists()


async def test_client_errors_are_terminal(fake_agent: Any, tmp_path: Path) -> None:
    agent, url = await fake_agent(lambda row, n: web.Response(status=422, text="bad"))
    with pytest.raises(CollectionFailed):
        await collect(_config(tmp_path, url))
    failures = read_jsonl(tmp_path / "r_failures.jsonl")
    assert len(failures) == 4 and all(f["_ng_failure_terminal"] for f in failures)
    assert set(agent.calls.values()) == {1}


async def test_unreachable_and_timeout_are_request_failures(
    fake_agent: Any, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(CollectionFailed):
        await collect(cfg)
    failures = read_jsonl(tmp_path / "r_failures.jsonl")
    assert {f["_ng_failure_class"] for f in failures} == {"agent_request_failed"}
    assert {f["_ng_failure_http_status"] for f in failures} == {None}

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    runner, url = await serve({"/run": slow})
    try:
        (tmp_path / "t").mkdir()
        cfg = _config(tmp_path / "t", url, request_timeout_s=0.2)
        with pytest.raises(CollectionFailed):
            await collect(cfg)
    finally:
        await runner.cleanup()
    timeouts = read_jsonl(tmp_path / "t" / "r_failures.jsonl")
    assert {f["_ng_failure_class"] for f in timeouts} == {"agent_request_failed"}
    assert {f["_ng_failure_type"] for f in timeouts} <= {"ServerTimeoutError", "TimeoutError"}


# --------------------------------------------------------------------------- Kafka


@pytest.mark.kafka
async def test_live_kafka_profile_equals_batch(
    servers: NgRun, kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topics = Topics.for_prefix(unique_name("collect"))
    processor = StreamProcessor(kafka_bootstrap, tmp_path / "profiles", topics)
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    try:
        src = write_problems(tmp_path / "problems.jsonl", 30)
        cfg = CollectConfig.model_validate(
            {
                "input_jsonl_fpath": src,
                "output_jsonl_fpath": tmp_path / "out" / "live.jsonl",
                "num_repeats": 3,
                "num_repeats_add_seed": True,
                "num_samples_in_parallel": 16,
                "head_server_url": servers.head_url,
                "kafka_bootstrap_servers": kafka_bootstrap,
                "kafka_topic_prefix": topics.inputs.rsplit(".", 1)[0],
                "kafka_wait_profile": True,  # the streamed final, next to the rollouts file
                "kafka_wait_profile_timeout_s": 60,
                "quiet": True,
            }
        )
        report = await collect(cfg)
        assert report.completed == 90
        assert report.profile is not None
        assert report.profile.reward_profiling == tmp_path / "out" / "live_reward_profiling.jsonl"
        assert processor.pipeline.runs[report.run_id].done
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    _profile_equals_batch(tmp_path / "out", tmp_path / "out", "live", tmp_path)
    mirror = tmp_path / "profiles" / report.run_id  # the processor's --output-dir
    _profile_equals_batch(mirror, tmp_path / "out", "live", tmp_path / "again")
