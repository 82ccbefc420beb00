"""The model server: ``POST /v1/responses`` and ``POST /v1/chat/completions``.

docs/nemo-gym-compat.md §Model server states NeMo Gym's contract.

Two modes, chosen by the config:

- **proxy** when ``openai_base_url`` is set (NeMo Gym's ``${policy_base_url}``): requests are
  relayed to that OpenAI-compatible endpoint (vLLM, OpenAI, ...) with ``openai_api_key`` as the
  bearer token and ``openai_model`` as the model. The key is never logged or served back.
- **simulated** otherwise: the offline
  :class:`~rewardstream.gym_servers.simulated_policy.SimulatedPolicy`, configured by the
  ``simulated_policy`` block; every reply says ``"model": "<name>"`` with the configured name
  (default ``simulated-policy``) and ``"simulated": true`` in its metadata.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable
from typing import Any

from aiohttp import ClientError, ClientSession, web
from pydantic import ValidationError

from rewardstream.gym_servers.base import (
    Handler,
    ServerSpec,
    base_app,
    client_session,
    json_body,
    json_response,
    request_limit,
    serve_from_env,
    with_closing,
)
from rewardstream.gym_servers.schemas import ResponsesRequest, input_messages, validation_detail
from rewardstream.gym_servers.simulated_policy import (
    Completion,
    PolicyConfig,
    SimulatedPolicy,
    request_seed,
)

__all__ = ["build_app", "main"]

_SESSION: web.AppKey[ClientSession] = web.AppKey("session", ClientSession)


def _ids(rng: random.Random, prefix: str) -> str:
    return f"{prefix}{rng.getrandbits(96):024x}"


def responses_object(request: ResponsesRequest, done: Completion, model: str) -> dict[str, Any]:
    """A Responses API object for one completion (usage as in docs/nemo-gym-compat.md §Result
    rows)."""
    rng = random.Random(done.text)
    return {
        "id": _ids(rng, "resp_"),
        "created_at": float(int(time.time())),
        "model": model,
        "object": "response",
        "output": [
            {
                "id": _ids(rng, "msg_"),
                "content": [{"annotations": [], "text": done.text, "type": "output_text"}],
                "role": "assistant",
                "status": "incomplete" if done.truncated else "completed",
                "type": "message",
            }
        ],
        "parallel_tool_calls": True,
        "temperature": request.temperature,
        "tool_choice": request.tool_choice or "auto",
        "tools": request.tools or [],
        "top_p": request.top_p,
        "max_output_tokens": request.max_output_tokens,
        "metadata": {"simulated": "true"},
        "status": "incomplete" if done.truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if done.truncated else None,
        "error": None,
        "usage": {
            "input_tokens": done.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": done.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.input_tokens + done.output_tokens,
        },
    }


def chat_object(done: Completion, model: str) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object for one completion."""
    return {
        "id": _ids(random.Random(done.text), "chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": done.text},
                "finish_reason": "length" if done.truncated else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": done.input_tokens,
            "completion_tokens": done.output_tokens,
            "total_tokens": done.input_tokens + done.output_tokens,
        },
        "simulated": True,
    }


def _unprocessable(detail: str) -> web.Response:
    return json_response({"detail": detail}, status=422)


def _simulated_routes(policy: SimulatedPolicy) -> dict[str, Handler]:
    name = policy.model_name

    async def run(messages: list[dict[str, Any]], *args: Any) -> Completion:
        done = policy.complete(messages, *args)
        if done.latency_s:
            await asyncio.sleep(done.latency_s)
        return done

    async def responses(request: web.Request) -> web.Response:
        try:
            req = ResponsesRequest.model_validate(await json_body(request))
        except ValidationError as exc:
            return _unprocessable(validation_detail(exc))
        if req.stream:
            return _unprocessable("stream: the simulated policy does not stream")
        messages = input_messages(req.input)
        if req.instructions:
            messages.insert(0, {"role": "system", "content": req.instructions})
        seed = request_seed(req.metadata, None)
        done = await run(messages, req.temperature, req.max_output_tokens, seed)
        return json_response(responses_object(req, done, name))

    async def chat(request: web.Request) -> web.Response:
        body = await json_body(request)
        messages = body.get("messages")
        if not isinstance(messages, list):
            return _unprocessable("messages: a list of messages is required")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        seed = request_seed(body.get("metadata"), body.get("seed"))
        done = await run(messages, body.get("temperature"), max_tokens, seed)
        return json_response(chat_object(done, name))

    return {"/v1/responses": responses, "/v1/chat/completions": chat}


def _scrubber(api_key: str | None) -> Callable[[bytes], bytes]:
    """Removes the key from what goes back to a client: an upstream may echo it in an error
    about it (replies are otherwise relayed unchanged). Placeholder keys shorter than 12
    characters (vLLM's ``EMPTY``) are left alone: they are no secret, and could be real text."""
    key = (api_key or "").encode() if len(api_key or "") >= 12 else b""

    def scrub(raw: bytes) -> bytes:
        return raw.replace(key, b"***") if key and key in raw else raw

    return scrub


_USERINFO = re.compile(r"//[^/@\s]+@")  # user:password@ in a URL


def _proxy_routes(base_url: str, api_key: str | None, model: str) -> dict[str, Handler]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    scrub = _scrubber(api_key)

    def relay(path: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            body = await json_body(request)
            if model:
                body["model"] = model
            url = f"{base_url.rstrip('/')}/{path}"
            try:
                async with request.app[_SESSION].post(url, json=body, headers=headers) as upstream:
                    raw = await upstream.read()
                    return web.Response(
                        body=scrub(raw),
                        status=upstream.status,
                        content_type=upstream.content_type or "application/json",
                    )
            except (ClientError, TimeoutError) as exc:
                detail = _USERINFO.sub("//***@", f"policy endpoint {url} failed: {exc!r}")
                return json_response({"detail": scrub(detail.encode()).decode()}, 502)

        return handler

    return {"/v1/responses": relay("responses"), "/v1/chat/completions": relay("chat/completions")}


def build_app(spec: ServerSpec, _config: dict[str, Any]) -> web.Application:
    """The model server of ``spec``: a proxy if it has an ``openai_base_url``, else simulated."""
    cfg = spec.config
    model = str(cfg.get("openai_model") or "")
    if cfg.get("openai_base_url"):
        routes = _proxy_routes(str(cfg["openai_base_url"]), cfg.get("openai_api_key"), model)
        app = base_app(routes, request_limit(spec))
        with_closing(app, _SESSION, client_session)
        return app
    policy = PolicyConfig.model_validate(cfg.get("simulated_policy") or {})
    simulated = _simulated_routes(SimulatedPolicy(policy, model or "simulated-policy"))
    return base_app(simulated, request_limit(spec))


def main() -> None:
    serve_from_env(build_app)


if __name__ == "__main__":
    main()
