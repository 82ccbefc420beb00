"""Environment servers, as NeMo Gym 0.7.0 wires them: which one fronts which agent.

In 0.7.0 rollout collection reaches an agent only through an environment server. A config's
``environment_servers`` block names its agents (a field ``agent_server``, or any field whose
value has ``type: responses_api_agents``); ``ng_run`` gives every agent that none names a
generated ``legacy_agent`` relay, named after the agent as 0.7.0 names it, with 0.7.0's
deprecation warning; the collector sends each row to the one server fronting its agent. The
rules and messages here are 0.7.0's (``nemo_gym/global_config.py``,
``rollout_collection.py``), so either side of a mixed setup finds the same servers.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import yaml

from rewardstream.errors import InputError
from rewardstream.gym_servers.base import ServerSpec, server_specs

__all__ = [
    "AGENTS",
    "ENVIRONMENT_SERVERS",
    "agent_refs",
    "deprecation",
    "front_agents",
    "legacy_block",
    "legacy_name",
    "server_for_agent",
]

ENVIRONMENT_SERVERS = "environment_servers"
AGENTS = "responses_api_agents"
SUFFIX = "_environment_server"
_ERROR_KEY = "error_on_agent_without_environment_server"


def agent_refs(server: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The agent references in one environment server's config."""
    return [
        ref
        for field, ref in server.items()
        if isinstance(ref, Mapping)
        and (ref.get("type") == AGENTS or (field == "agent_server" and ref.get("type") is None))
    ]


def _fronting(config: Mapping[str, Any]) -> dict[str, list[ServerSpec]]:
    """Per agent name, the environment servers that name it, in config order."""
    out: dict[str, list[ServerSpec]] = {}
    for spec in server_specs(config):
        if spec.server_type == ENVIRONMENT_SERVERS:
            for ref in agent_refs(spec.config):
                if ref.get("name") is not None:
                    out.setdefault(str(ref["name"]), []).append(spec)
    return out


def legacy_name(agent: str, agent_type: str) -> str:
    """An agent's generated relay's name: the agent type, or else a trailing ``_agent``,
    stripped from the agent's name (``arithmetic_simple_agent``:
    ``arithmetic_environment_server``)."""
    stem = agent.removesuffix(f"_{agent_type}").removesuffix(agent_type).rstrip("_")
    if stem == agent:
        stem = agent.removesuffix("_agent").rstrip("_")
    return f"{stem or agent_type}{SUFFIX}"


def legacy_block(agent: str) -> dict[str, Any]:
    return {
        ENVIRONMENT_SERVERS: {
            "legacy_agent": {
                "entrypoint": "app.py",
                "agent_server": {"type": AGENTS, "name": agent},
            }
        }
    }


def front_agents(config: dict[str, Any]) -> dict[str, str]:
    """Give every agent no environment server names a ``legacy_agent`` relay (appended to
    ``config``); returns {agent: relay}. With ``error_on_agent_without_environment_server``
    set, such an agent is an error instead."""
    fronted = _fronting(config)
    alone = sorted(
        s.name
        for s in server_specs(config)
        if s.server_type == AGENTS and s.name not in fronted and s.config.get("entrypoint")
    )
    if not alone:
        return {}
    if config.get(_ERROR_KEY):
        listing = ", ".join(alone)
        raise InputError(
            f"agent instance(s) have no environment server, so rollout collection cannot reach "
            f"them: {listing} (declare one naming each agent in its agent_server, or unset "
            f"{_ERROR_KEY} for a generated legacy_agent relay)"
        )
    types = {s.name: s.impl for s in server_specs(config) if s.server_type == AGENTS}
    generated: dict[str, str] = {}
    for agent in alone:
        name = legacy_name(agent, types[agent])
        if name in config or name in generated.values():
            name = f"{agent}{SUFFIX}"
        while name in config:
            name = f"{name}{SUFFIX}"
        config[name] = legacy_block(agent)
        generated[agent] = name
    return generated


def deprecation(generated: Mapping[str, str]) -> str:
    """0.7.0's warning for generated relays, with the blocks to declare instead."""
    blocks = "\n".join(
        yaml.safe_dump({server: legacy_block(agent)}, sort_keys=False)
        for agent, server in generated.items()
    )
    agents = ", ".join(f"`{agent}`" for agent in generated)
    return f"""DEPRECATED: agents without an environment server: {agents}.
Rollout collection reaches an agent only through an environment server.
This run generated a legacy_agent environment server for each agent above.
Each one relays /run to its agent unchanged, so results are not affected.
A future release will reject these configs with AgentWithoutEnvironmentServerError.

To migrate, add these blocks to your config, at the same level as the agents:

{textwrap.indent(blocks, "     ")}
To make this an error now, set {_ERROR_KEY}: true in your config.
You can also pass +{_ERROR_KEY}=true on the command line."""


def server_for_agent(config: Mapping[str, Any], agent: str) -> ServerSpec:
    """The environment server a row of ``agent`` goes to (0.7.0's errors otherwise)."""
    servers = _fronting(config).get(agent, [])
    if len(servers) == 1:
        return servers[0]
    if not servers:
        raise InputError(
            f"Agent '{agent}' has no environment server, so collection cannot reach it. "
            "Config validation should have caught this before any server started."
        )
    raise InputError(
        f"Agent '{agent}' is fronted by several environment servers: "
        f"{sorted(s.name for s in servers)}. Rows that route by agent cannot choose between "
        "them. Set environment_routing_mode=legacy with environment_server_name, or route "
        "these rows by taskset."
    )
