"""The strict OpenAI Responses request and usage arithmetic shared by the servers.

The request's fields: docs/nemo-gym-compat.md §Model server.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ResponsesRequest", "add_usage", "input_messages", "validation_detail"]


class ResponsesRequest(BaseModel):
    """A Responses API request: unknown keys are rejected, as NeMo Gym's agents do."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    store: bool | None = None
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: str | None = None
    user: str | None = None
    stream: bool | None = None
    background: bool | None = None
    include: list[str] | None = None


def validation_detail(exc: ValidationError) -> str:
    """The first validation problem in one line: ``field.path: message``."""
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's ``input`` as a list of items (a bare string is one user message)."""
    return [{"role": "user", "content": value}] if isinstance(value, str) else list(value)


def add_usage(total: Any, usage: Any) -> Any:
    """Sum two usage objects field by field (nested details included); None is the identity."""
    if total is None:
        return usage
    if usage is None:
        return total
    if isinstance(total, dict) and isinstance(usage, dict):
        return {k: add_usage(total.get(k), usage.get(k)) for k in {**total, **usage}}
    if isinstance(total, int | float) and isinstance(usage, int | float):
        return total + usage
    return usage
