"""NeMo Gym 0.7.0's ``legacy_agent`` environment server: the relay in front of an agent.

In 0.7.0 every rollout goes through an environment server; ``legacy_agent`` fronts one agent
(``agent_server: {type: responses_api_agents, name: ...}``) and relays ``POST /run`` to it byte
for byte, status included (an agent's 500 stays a 500), and ``POST /aggregate_metrics`` too.
It adds no stamps: the collector stamps ``_ng_environment_server`` and ``_ng_result_type``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rewardstream.gym_servers.base import (
    ServerSpec,
    base_app,
    request_limit,
    resolve_url,
    serve_from_env,
    with_closing,
)
from rewardstream.gym_servers.client import JsonClient

__all__ = ["build_app", "main"]

_CLIENT: web.AppKey[JsonClient] = web.AppKey("client", JsonClient)


def build_app(spec: ServerSpec, config: dict[str, Any]) -> web.Application:
    agent = resolve_url(config, spec.config["agent_server"])

    def relay(path: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            client = request.app[_CLIENT]
            try:
                status, body = await client.request(f"{agent}{path}", await request.read())
            except (OSError, EOFError) as exc:  # the agent is down: as a proxy says so
                detail = f"agent {spec.config['agent_server'].get('name')!r} at {agent}: {exc}"
                raise web.HTTPBadGateway(text=detail) from None
            return web.Response(body=body, status=status, content_type="application/json")

        return handler

    app = base_app(
        {"/run": relay("/run"), "/aggregate_metrics": relay("/aggregate_metrics")},
        request_limit(spec),
    )
    with_closing(app, _CLIENT, JsonClient)
    return app


def main() -> None:
    serve_from_env(build_app)


if __name__ == "__main__":
    main()
