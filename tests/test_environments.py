"""Environment servers as NeMo Gym 0.7.0 wires them (:mod:`rewardstream.gym_servers.environments`
and the ``legacy_agent`` relay): names, generated relays, routing errors, and the relay itself
against a real agent on loopback, an error status passed through."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import ClientSession, web

from rewardstream.errors import InputError
from rewardstream.gym_servers import environment_server
from rewardstream.gym_servers.aggregate import aggregate_metrics
from rewardstream.gym_servers.base import server_specs
from rewardstream.gym_servers.environments import (
    front_agents,
    legacy_name,
    server_for_agent,
)
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG, load_config
from rewardstream.kafka.local import free_port


def _agent(name: str, impl: str = "simple_agent") -> dict[str, Any]:
    return {name: {"responses_api_agents": {impl: {"entrypoint": "app.py"}}}}


def _relay(name: str, *agents: str) -> dict[str, Any]:
    block: dict[str, Any] = {"entrypoint": "app.py"}
    for i, agent in enumerate(agents):
        key = "agent_server" if i == 0 else f"other_{i}"
        block[key] = {"type": "responses_api_agents", "name": agent}
    return {name: {"environment_servers": {"legacy_agent": block}}}


def test_relay_names_follow_0_7_0() -> None:
    assert legacy_name("arithmetic_simple_agent", "simple_agent") == "arithmetic_environment_server"
    assert legacy_name("workplace_assistant_simple_agent", "simple_agent") == (
        "workplace_assistant_environment_server"
    )
    assert legacy_name("math_agent", "react_agent") == "math_environment_server"
    assert legacy_name("simple_agent", "simple_agent") == "simple_agent_environment_server"


def test_agents_without_a_server_get_a_relay_at_the_end() -> None:
    config = {
        **_agent("a_simple_agent"),
        **_agent("b_simple_agent"),
        **_relay("b_env", "b_simple_agent"),
    }
    config |= {"a_environment_server": {"unrelated": 1}}  # the name is taken: the agent's own
    assert front_agents(config) == {"a_simple_agent": "a_simple_agent_environment_server"}
    assert list(config)[-1] == "a_simple_agent_environment_server"
    spec = server_for_agent(config, "a_simple_agent")
    assert (spec.name, spec.server_type, spec.impl) == (
        "a_simple_agent_environment_server",
        "environment_servers",
        "legacy_agent",
    )
    assert server_for_agent(config, "b_simple_agent").name == "b_env"
    assert front_agents(config) == {}  # every agent is fronted now


def test_routing_errors_are_0_7_0s() -> None:
    config = {**_agent("a"), **_relay("one", "a"), **_relay("two", "a")}
    with pytest.raises(
        InputError, match=r"Agent 'a' is fronted by several environment servers: \['one', 'two'\]"
    ):
        server_for_agent(config, "a")
    with pytest.raises(
        InputError, match="Agent 'z' has no environment server, so collection cannot reach it"
    ):
        server_for_agent(config, "z")
    with pytest.raises(InputError, match="have no environment server"):
        front_agents({**_agent("x"), "error_on_agent_without_environment_server": True})


def test_ng_run_generates_a_relay_with_0_7_0s_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundled = yaml.safe_load(BUNDLED_CONFIG.read_text())
    assert "arithmetic_environment_server" in bundled  # declared: no warning for it
    load_config([f"+config_paths=[{BUNDLED_CONFIG}]"])
    assert capsys.readouterr().err == ""
    del bundled["arithmetic_environment_server"]
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(yaml.safe_dump(bundled, sort_keys=False))
    config = load_config([f"+config_paths=[{legacy}]"])
    err = capsys.readouterr().err
    assert err.startswith(
        "DEPRECATED: agents without an environment server: `arithmetic_simple_agent`."
    )
    assert (
        server_for_agent(config, "arithmetic_simple_agent").name == "arithmetic_environment_server"
    )


@pytest.fixture
async def agent_and_relay() -> AsyncIterator[str]:
    """A real agent (answers 500 to a row asking for it) and the relay in front of it."""

    async def run(request: web.Request) -> web.Response:
        row = orjson.loads(await request.read())
        status = 500 if row.get("fail") else 200
        return web.Response(
            body=orjson.dumps({"echo": row}), status=status, content_type="application/json"
        )

    agent = web.Application()
    agent.router.add_post("/run", run)
    agent.router.add_post("/aggregate_metrics", run)
    agent_port, relay_port = free_port(), free_port()
    config = {
        **{
            "ag": {
                "responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": agent_port}}
            }
        },
        **_relay("env", "ag"),
    }
    spec = next(s for s in server_specs(config) if s.name == "env")
    runners = []
    for app, port in (
        (agent, agent_port),
        (environment_server.build_app(spec, config), relay_port),
    ):
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    yield f"http://127.0.0.1:{relay_port}"
    for runner in runners:
        await runner.cleanup()


async def test_the_relay_passes_run_through_byte_for_byte(agent_and_relay: str) -> None:
    async with ClientSession() as session:
        body = b'{"b":1,"a":[1.50,"\\u00e9"]}'
        async with session.post(f"{agent_and_relay}/run", data=body) as r:
            assert r.status == 200
            assert await r.read() == b'{"echo":{"b":1,"a":[1.5,"\xc3\xa9"]}}'
        async with session.post(f"{agent_and_relay}/run", data=b'{"fail":true}') as r:
            assert r.status == 500  # the agent's error, not the relay's
        async with session.post(f"{agent_and_relay}/aggregate_metrics", data=b"{}") as r:
            assert r.status == 200 and await r.json() == {"echo": {}}
        async with session.get(f"{agent_and_relay}/health") as r:
            assert await r.json() == {"status": "ok"}


def test_a_fully_masked_run_reports_coverage_only() -> None:
    """0.7.0's rule: every rollout masked, so no means over an empty set and no num_repeats;
    a run with a measured rollout has its metrics and num_repeats last."""
    rows = [
        {"_ng_task_index": t, "_ng_rollout_index": r, "reward": 1.0, "mask_sample": True}
        for t in range(3)
        for r in range(2)
    ]
    masked = aggregate_metrics(rows)
    coverage = {
        "coverage/measured_rollouts": 0,
        "coverage/masked_rollouts": 6,
        "coverage/measured_tasks": 0,
        "coverage/fully_masked_tasks": 3,
    }
    assert masked["agent_metrics"] == masked["key_metrics"] == coverage
    assert list(masked["agent_metrics"]) == list(coverage)
    assert masked["group_level_metrics"] == masked["repeat_level_metrics"] == []
    rows[0]["mask_sample"] = False
    measured = aggregate_metrics(rows)
    assert list(measured["agent_metrics"])[-1] == "num_repeats"
    assert measured["agent_metrics"]["num_repeats"] == 2
