"""The arithmetic resources server: ``/seed_session``, ``/verify``.

docs/nemo-gym-compat.md §Resources server states NeMo Gym's contract.

``/verify`` extracts the answer from the response text and compares it with the row's
``expected_answer`` exactly (as numbers: ``37.50`` equals ``37.5``). The reply has NeMo Gym's
key order (docs/nemo-gym-compat.md §Result rows): ``responses_create_params``, ``response``,
``reward``, ``mask_sample``, ``failure_kind``, ``failure_reason``, the environment's fields
(``extracted_answer``, ``is_correct``), then every other field of the request, echoed.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rewardstream.errors import RewardstreamError
from rewardstream.gym_servers.aggregate import aggregate_metrics
from rewardstream.gym_servers.base import (
    ServerSpec,
    base_app,
    json_body,
    json_response,
    request_limit,
    serve_from_env,
)
from rewardstream.gym_servers.math_env import verify

__all__ = ["build_app", "main"]


async def _seed_session(request: web.Request) -> web.Response:
    await json_body(request)
    return json_response({})


async def _verify(request: web.Request) -> web.Response:
    body = await json_body(request)
    expected = body.get("expected_answer")
    if not isinstance(expected, str) or "response" not in body:
        return json_response(
            {"detail": "verify needs 'response' and a string 'expected_answer'"}, status=422
        )
    checked = verify(body["response"], expected)
    reply: dict[str, Any] = {
        "responses_create_params": body.get("responses_create_params"),
        "response": body["response"],
        "reward": checked["reward"],
        "mask_sample": False,
        "failure_kind": None,
        "failure_reason": None,
        "extracted_answer": checked["extracted_answer"],
        "is_correct": checked["is_correct"],
    }
    for key, value in body.items():
        reply.setdefault(key, value)
    return json_response(reply)


async def _aggregate(request: web.Request) -> web.Response:
    body = await json_body(request)
    try:
        return json_response(aggregate_metrics(body.get("verify_responses") or []))
    except RewardstreamError as exc:
        return json_response({"detail": str(exc)}, status=422)


def build_app(spec: ServerSpec, _config: dict[str, Any]) -> web.Application:
    return base_app(
        {
            "/seed_session": _seed_session,
            "/close_session": _seed_session,
            "/verify": _verify,
            "/aggregate_metrics": _aggregate,
        },
        request_limit(spec),
    )


def main() -> None:
    serve_from_env(build_app)


if __name__ == "__main__":
    main()
