"""The gym servers and ``ng_run``, started for real on loopback (no mocks)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession, web

from rewardstream.errors import InputError
from rewardstream.gym_servers.base import redacted
from rewardstream.gym_servers.math_env import DATASET, generate
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG, ServerGroup, load_config
from rewardstream.kafka.local import free_port
from tests.gym import NgRun, fast, ng_run, serve

AGENT, MODEL, RESOURCES = "arithmetic_simple_agent", "policy_model", "arithmetic_resources_server"


@pytest.fixture(scope="module")
def servers() -> Iterator[NgRun]:
    with ng_run(*fast()) as run:
        yield run


def _row(i: int = 0, **extra: Any) -> dict[str, Any]:
    row = next(r for n, r in enumerate(generate(i + 1, 0)) if n == i)
    return row | {"_ng_task_index": i, "_ng_rollout_index": 0} | extra


async def _post(url: str, body: Any) -> tuple[int, Any]:
    async with ClientSession() as s, s.post(url, data=orjson.dumps(body)) as r:
        return r.status, orjson.loads(await r.read())


def test_bundled_dataset_is_the_generator_output() -> None:
    expected = b"".join(orjson.dumps(r) + b"\n" for r in generate(300, 0))
    assert DATASET.read_bytes() == expected


def test_head_server_lists_instances_and_health(servers: NgRun) -> None:
    """``/server_instances`` as 0.7.0's: its fields in its order, ``process_name`` and
    ``config_path`` the instance, ``name`` the implementation, the environment server too."""
    instances = servers.get("/server_instances")
    assert [(i["process_name"], i["server_type"], i["name"]) for i in instances] == [
        (MODEL, "responses_api_models", "simulated_model"),
        (RESOURCES, "resources_servers", "arithmetic"),
        (AGENT, "responses_api_agents", "simple_agent"),
        ("arithmetic_environment_server", "environment_servers", "legacy_agent"),
    ]
    fields = ["config_path", "dir_path", "entrypoint", "host", "name", "pid", "port"]
    fields += ["process_name", "server_type", "start_time", "status", "uptime_seconds", "url"]
    for inst in instances:
        assert list(inst) == fields and inst["config_path"] == inst["process_name"]
        assert inst["host"] == "127.0.0.1" and 10001 <= inst["port"] <= 20000
        assert inst["url"] == f"http://127.0.0.1:{inst['port']}"
        assert (inst["status"], inst["uptime_seconds"]) == (None, None)
        assert Path(inst["dir_path"]).is_dir()
    config = servers.get("/global_config_dict_yaml")
    assert isinstance(config, str) and "arithmetic_simple_agent:" in config
    for path in ("/", "/livez", "/readyz", "/healthz", "/health"):
        assert servers.get(path) == {"status": "ok"}


async def test_agent_run_seeds_calls_model_and_verifies(servers: NgRun) -> None:
    row = _row(0, verifier_metadata={"x": 1})
    status, result = await _post(f"{servers.url(AGENT)}/run", row)
    assert status == 200
    head = list(result)[:8]
    assert head == [
        *("responses_create_params", "response", "reward", "mask_sample"),
        *("failure_kind", "failure_reason", "extracted_answer", "is_correct"),
    ]
    assert result["reward"] == (1.0 if result["is_correct"] else 0.0)
    assert result["_ng_task_index"] == 0 and result["expected_answer"] == row["expected_answer"]
    usage = result["response"]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    assert result["responses_create_params"]["temperature"] is None  # every field, defaults too


async def test_agent_rejects_unknown_request_keys(servers: NgRun) -> None:
    bad = _row(0)
    bad["responses_create_params"] = bad["responses_create_params"] | {"bogus": 1}
    status, body = await _post(f"{servers.url(AGENT)}/run", bad)
    assert status == 422 and "bogus" in body["detail"]


async def test_verify_is_exact_on_the_extracted_answer(servers: NgRun) -> None:
    def response(text: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text}]
        return {"output": [{"type": "message", "content": content}]}

    url = f"{servers.url(RESOURCES)}/verify"
    cases = [
        ("so \\boxed{37.50}", "37.5", True, "37.50"),
        ("The total is 1,250 apples.", "1250", True, "1,250"),
        ("\\boxed{41}", "42", False, "41"),
        ("no idea", "42", False, None),
    ]
    for text, expected, correct, extracted in cases:
        status, body = await _post(url, {"response": response(text), "expected_answer": expected})
        assert status == 200
        assert (body["is_correct"], body["extracted_answer"]) == (correct, extracted)
        assert body["reward"] == float(correct)


async def test_simulated_policy_is_deterministic_per_seed(servers: NgRun) -> None:
    url = f"{servers.url(MODEL)}/v1/responses"
    question = _row(5)["responses_create_params"]["input"]

    async def ask(seed: int, temperature: float = 1.0) -> Any:
        body = {"input": question, "temperature": temperature}
        body["metadata"] = {"extra_body": f'{{"seed": {seed}}}'}
        status, reply = await _post(url, body)
        assert status == 200 and reply["metadata"] == {"simulated": "true"}
        return reply["output"][0]["content"][0]["text"], reply["usage"]

    assert await ask(3) == await ask(3)
    assert len({(await ask(s))[0] for s in range(8)}) > 1
    assert len({(await ask(s, temperature=0.0))[0].split()[-1] for s in range(4)}) == 1
    status, chat = await _post(
        f"{servers.url(MODEL)}/v1/chat/completions", {"messages": question, "seed": 3}
    )
    assert status == 200 and chat["object"] == "chat.completion"
    assert chat["usage"]["completion_tokens"] > 0 and chat["choices"][0]["message"]["content"]


async def test_simulated_accuracy_depends_on_the_task(servers: NgRun) -> None:
    """Easy tasks are answered right more often than hard ones (per-task difficulty)."""
    url = f"{servers.url(AGENT)}/run"
    rates = []
    for i in (2, 0):  # "travel" (1 step) and "expression" (3 steps, many digits)
        row = _row(i)
        wins = 0
        for seed in range(40):
            row["responses_create_params"] = row["responses_create_params"] | {
                "temperature": 1.0,
                "metadata": {"extra_body": f'{{"seed": {seed}}}'},
            }
            _, result = await _post(url, row)
            wins += result["is_correct"]
        rates.append(wins / 40)
    assert rates[0] > rates[1]


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A tiny OpenAI-compatible endpoint that records what it was sent."""
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append({"path": request.path, "auth": request.headers.get("Authorization")})
        seen[-1]["body"] = orjson.loads(await request.read())
        return web.json_response({"object": "response", "output": [], "usage": None})

    runner, url = await serve({"/v1/responses": handler, "/v1/chat/completions": handler})
    try:
        yield f"{url}/v1", seen
    finally:
        await runner.cleanup()


async def test_proxy_mode_forwards_with_the_key_and_never_shows_it(
    upstream: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    base, seen = upstream
    secret = "sk-test-SECRET-123"
    config = load_config(
        [
            f"+config_paths=[{BUNDLED_CONFIG}]",
            f"+head_server.port={free_port()}",
            f"+policy_base_url={base}",
            f"+policy_api_key={secret}",
            "+policy_model_name=my-model",
        ]
    )
    log = tmp_path / "servers.log"
    with log.open("wb") as fh:
        async with ServerGroup(config, fh) as group:
            model = group.url(MODEL)
            status, _ = await _post(f"{model}/v1/responses", {"input": "hi", "model": "x"})
            assert status == 200
            status, _ = await _post(f"{model}/v1/chat/completions", {"messages": []})
            assert status == 200
            async with (
                ClientSession() as s,
                s.get(f"{group.head_url}/global_config_dict_yaml") as r,
            ):
                served = await r.text()
    assert [s["path"] for s in seen] == ["/v1/responses", "/v1/chat/completions"]
    assert all(s["auth"] == f"Bearer {secret}" for s in seen)
    assert seen[0]["body"]["model"] == "my-model"
    assert secret not in served and secret not in log.read_text()
    config = {"openai_api_key": secret, "x": [{"hf_token": "k"}], "max_tokens": 5}
    assert redacted(config) == {
        "openai_api_key": "***",
        "x": [{"hf_token": "***"}],
        "max_tokens": 5,
    }


def test_ng_run_sigterm_stops_every_server() -> None:
    run = NgRun(*fast())
    try:
        pids = run.pids()
        assert len(pids) == 4 and all(_alive(p) for p in pids)  # with the environment server
    finally:  # a failed check must not leave the servers running
        assert run.stop() == 0
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_servers_exit_when_ng_run_is_killed() -> None:
    """Even a SIGKILLed ng_run leaves no server behind (each watches its parent)."""
    run = NgRun(*fast())
    pids = run.pids()
    run.proc.send_signal(signal.SIGKILL)
    run.stop()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ng_run_config_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    missing = tmp_path / "missing.yaml"
    required = tmp_path / "required.yaml"
    required.write_text(
        "m:\n  responses_api_models:\n    x:\n"
        "      entrypoint: rewardstream.gym_servers.model_server\n"
        "      openai_api_key: '???'\n"
    )
    for path, message in [
        (bad, "Invalid YAML in"),
        (missing, "Cannot read config"),
        (required, "config key 'm.responses_api_models.x.openai_api_key' is required"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "rewardstream.gym_servers.ng_run", f"+config_paths=[{path}]"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    with pytest.raises(InputError, match="no config given"):
        load_config([])


async def test_a_server_that_dies_while_starting_is_reported(tmp_path: Path) -> None:
    broken = "+arithmetic_resources_server.resources_servers.arithmetic.entrypoint=no.such.module"
    config = load_config(
        [f"+config_paths=[{BUNDLED_CONFIG}]", f"+head_server.port={free_port()}", broken]
    )
    with (tmp_path / "log").open("wb") as log:
        group = ServerGroup(config, log)
        with pytest.raises(InputError, match="'arithmetic_resources_server' exited"):
            async with group:
                pass
    assert all(p.poll() is not None for p in group.procs.values())


def test_configs_env_yaml_and_overrides_merge_as_omegaconf_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configs < ``env.yaml`` (of the working folder) < the command line; ``${...}`` anywhere
    in a string and OmegaConf's resolvers; a bad interpolation is one line naming its key.
    (Equal to 0.7.0's own parse: ``tests/test_nemo_interop.py``.)"""
    extra = tmp_path / "extra.yaml"
    extra.write_text("host: h\nport: 1\nurl: http://${host}:${port}/v1\nxs: [1, 2]\n")
    (tmp_path / "env.yaml").write_text("host: from-env\nxs: [3]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REWARDSTREAM_TEST_VALUE", "v")
    paths = f"+config_paths=[{BUNDLED_CONFIG},{extra}]"
    config = load_config([paths, "+port=7", "+env=${oc.env:REWARDSTREAM_TEST_VALUE}"])
    assert (config["url"], config["xs"], config["env"]) == ("http://from-env:7/v1", [3], "v")
    with pytest.raises(InputError, match=r"^config key 'url': Interpolation key 'nope' not found$"):
        load_config([paths, "+url=${nope}"])
