"""A simple agent (NeMo Gym's ``simple_agent``): ``/run``, ``/v1/responses``,
``/aggregate_metrics`` (docs/nemo-gym-compat.md §Agent server).

``/run`` takes one materialized row: ``seed_session`` on the resources server, the tool loop
against the model server, then ``verify``; the reply is the verify JSON. The tool loop turns each
``function_call`` into ``POST <resources>/<tool name>`` and stops at a plain answer, an
incomplete response or ``max_steps``; ``usage`` is summed over the turns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from rewardstream.gym_servers.base import (
    ServerSpec,
    base_app,
    json_body,
    json_response,
    request_limit,
    resolve_url,
    serve_from_env,
    with_closing,
)
from rewardstream.gym_servers.client import JsonClient, UpstreamError
from rewardstream.gym_servers.schemas import (
    ResponsesRequest,
    add_usage,
    input_messages,
    validation_detail,
)

__all__ = ["build_app", "main"]

_CLIENT: web.AppKey[JsonClient] = web.AppKey("client", JsonClient)


class _Agent:
    def __init__(self, spec: ServerSpec, config: dict[str, Any]) -> None:
        cfg = spec.config
        self.resources = resolve_url(config, cfg["resources_server"])
        self.model = resolve_url(config, cfg["model_server"])
        self.max_steps = int(cfg.get("max_steps") or 10)
        self.skip_verification = bool(cfg.get("skip_verification"))

    async def responses(self, client: JsonClient, request: ResponsesRequest) -> Any:
        """The tool loop: the last response, with every turn's output and the summed usage."""
        params = request.model_dump(exclude_none=True)
        items = input_messages(request.input)
        outputs: list[Any] = []
        usage: Any = None
        response: Any = {}
        for _ in range(self.max_steps):
            response = await client.post(f"{self.model}/v1/responses", params | {"input": items})
            usage = add_usage(usage, response.get("usage"))
            new = response.get("output") or []
            outputs += new
            items += new
            calls = [o for o in new if isinstance(o, dict) and o.get("type") == "function_call"]
            if not calls or response.get("incomplete_details"):
                break
            for call in calls:
                arguments = orjson.loads(call.get("arguments") or "{}")
                result = await client.post(f"{self.resources}/{call['name']}", arguments)
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": call.get("call_id"),
                        "output": orjson.dumps(result).decode(),
                    }
                )
        return response | {"output": outputs, "usage": usage}

    async def run(self, client: JsonClient, row: dict[str, Any]) -> Any:
        request = ResponsesRequest.model_validate(row.get("responses_create_params"))
        await client.post(f"{self.resources}/seed_session", row)
        response = await self.responses(client, request)
        full = row | {"responses_create_params": request.model_dump(), "response": response}
        if self.skip_verification:
            return full | {"reward": 0.0, "verification_skipped": True}
        return await client.relay(f"{self.resources}/verify", full)  # the reply, unparsed


def _replies(
    handler: Callable[[web.Request], Awaitable[Any]], prefix: str = ""
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``handler``'s JSON reply; an invalid request is a 422, a failed call to another server
    a 502 naming it (never a silent success)."""

    async def reply(request: web.Request) -> web.Response:
        try:
            return json_response(await handler(request))
        except ValidationError as exc:
            return json_response({"detail": f"{prefix}{validation_detail(exc)}"}, status=422)
        except UpstreamError as exc:
            return json_response({"detail": str(exc), "upstream_status": exc.status}, status=502)

    return reply


def build_app(spec: ServerSpec, config: dict[str, Any]) -> web.Application:
    agent = _Agent(spec, config)

    async def run(request: web.Request) -> Any:
        return await agent.run(request.app[_CLIENT], await json_body(request))

    async def responses(request: web.Request) -> Any:
        req = ResponsesRequest.model_validate(await json_body(request))
        return await agent.responses(request.app[_CLIENT], req)

    async def aggregate(request: web.Request) -> Any:
        body = await json_body(request)
        return await request.app[_CLIENT].post(f"{agent.resources}/aggregate_metrics", body)

    app = base_app(
        {
            "/run": _replies(run, "responses_create_params."),
            "/v1/responses": _replies(responses),
            "/aggregate_metrics": _replies(aggregate),
        },
        request_limit(spec),
    )
    with_closing(app, _CLIENT, JsonClient)
    return app


def main() -> None:
    serve_from_env(build_app)


if __name__ == "__main__":
    main()
