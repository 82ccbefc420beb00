"""A SIMULATED policy: no language model, a seeded random generator that writes like one.

It exists so that collection, profiling and the demo run offline and reproducibly. It reads
the question, solves problems of the bundled arithmetic kind exactly
(:func:`rewardstream.gym_servers.math_env.solve`), and then answers right with a probability that
depends on the task: more steps and more digits make a problem harder. At temperature 0 it is greedy
(right exactly when that probability is at least one half, whatever the seed); otherwise the outcome
is drawn from a generator seeded by the request's seed (``metadata.extra_body`` as NeMo Gym stamps
it, or ``seed``), the model name and the prompt, so the same request always gets the same answer.
Without a seed it draws from one server-wide stream. Usage counts about one token per word or
punctuation mark of the text in and out; latency is a time to first token plus a time per output
token, both configurable (0 turns waiting off, e.g. for benchmarks).
"""

from __future__ import annotations

import hashlib
import random
import re
from fractions import Fraction
from functools import lru_cache
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field

from rewardstream.gym_servers.math_env import format_number, solve

__all__ = ["Completion", "PolicyConfig", "SimulatedPolicy"]

_TOKEN = re.compile(r"\w+|[^\w\s]")
_FILLER = (
    "Let me read the problem carefully and note the quantities involved.",
    "First I identify what is being asked.",
    "I will keep track of the units as I go.",
    "Now I combine the intermediate results.",
    "Let me double-check this step before moving on.",
    "This gives the value needed for the next step.",
)


class PolicyConfig(BaseModel):
    """The ``simulated_policy`` block of a model server's config."""

    model_config = ConfigDict(extra="forbid")

    skill: float = Field(
        default=0.95, ge=0, le=1, description="chance of a right answer on a trivial task"
    )
    seed: int = 0
    latency_s: float = Field(default=0.05, ge=0, description="time to first token")
    seconds_per_token: float = Field(default=0.002, ge=0)


class Completion(NamedTuple):
    """One generated answer: its text, token counts, whether it was cut, and how long it took."""

    text: str
    input_tokens: int
    output_tokens: int
    truncated: bool
    latency_s: float


def count_tokens(text: str) -> int:
    """About one token per word or punctuation mark."""
    return len(_TOKEN.findall(text))


# prompts and sentences come back (once per repeat): count each one once
_cached_tokens = lru_cache(maxsize=1 << 16)(count_tokens)
_solved = lru_cache(maxsize=1 << 14)(solve)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: {"type": "input_text", "text": ...}
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def request_seed(metadata: Any, explicit: Any) -> int | None:
    """The seed of a request: ``seed`` if given, else ``metadata.extra_body``'s
    (docs/nemo-gym-compat.md §Materialization)."""
    if isinstance(explicit, int):
        return explicit
    extra = metadata.get("extra_body") if isinstance(metadata, dict) else None
    if isinstance(extra, str):
        try:
            seed = orjson.loads(extra).get("seed")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return seed if isinstance(seed, int) else None
    return None


class SimulatedPolicy:
    """Answers chat-style requests; see the module docstring for how."""

    def __init__(self, config: PolicyConfig, model_name: str) -> None:
        self.config, self.model_name = config, model_name
        self._unseeded = random.Random(config.seed)

    def complete(
        self,
        messages: list[dict[str, Any]],
        temperature: float | None,
        max_tokens: int | None,
        seed: int | None,
    ) -> Completion:
        prompt = "\n".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
        temperature = 1.0 if temperature is None else temperature
        if seed is None:
            rng = random.Random(self._unseeded.getrandbits(64))
        else:
            key = f"{self.config.seed}|{seed}|{self.model_name}|{temperature}|{prompt}".encode()
            rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:16]))
        question = next(
            (_text_of(m.get("content")) for m in reversed(messages) if m.get("role") == "user"),
            prompt,
        )
        lines = self._answer(question, temperature, rng)
        text = " ".join(lines)
        truncated = False
        if max_tokens is not None and text.count(" ") >= max_tokens:  # cut at the limit
            text, truncated = " ".join(text.split(" ")[:max_tokens]), True
            out_tokens = count_tokens(text)
        else:
            out_tokens = sum(_cached_tokens(line) for line in lines)
        latency = 0.0
        if self.config.latency_s or self.config.seconds_per_token:
            jitter = rng.uniform(0.8, 1.25)
            latency = (self.config.latency_s + self.config.seconds_per_token * out_tokens) * jitter
        return Completion(text, _cached_tokens(prompt), out_tokens, truncated, latency)

    def _answer(self, question: str, temperature: float, rng: random.Random) -> list[str]:
        """The answer's sentences: some reasoning steps, then the final answer."""
        solved = _solved(question)
        if solved is None:
            guess = rng.randint(1, 100)
            return [f"I am not sure how to solve this. My best guess is \\boxed{{{guess}}}."]
        difficulty = 0.07 * solved.steps + 0.02 * solved.digits
        p_right = min(0.98, max(0.05, self.config.skill - difficulty))
        right = p_right >= 0.5 if temperature == 0 else rng.random() < p_right
        numbers = _numbers(question)
        final = format_number(solved.answer if right else _mistake(solved.answer, numbers, rng))
        lines = [rng.choice(_FILLER)]
        for step in range(1, solved.steps + 1):
            lines.append(
                f"Step {step}: I work with {rng.choice(numbers)} and {rng.choice(numbers)}."
            )
            lines += [rng.choice(_FILLER) for _ in range(rng.randrange(3))]
        if rng.random() < 0.05:  # sometimes the requested format is forgotten
            lines.append(f"So the result is {final}.")
        else:
            lines.append(f"The answer is \\boxed{{{final}}}.")
        return lines


@lru_cache(maxsize=1 << 14)
def _numbers(question: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\d+", question))


_SLIPS = (-10, -2, -1, 1, 2, 10)


def _mistake(answer: Fraction, numbers: tuple[str, ...], rng: random.Random) -> Fraction:
    """A plausible wrong answer: an off-by-a-little, a dropped digit, or a number from the text."""
    while True:
        k = rng.randrange(len(_SLIPS) + 1 + len(numbers))
        if k < len(_SLIPS):
            wrong = answer + _SLIPS[k]
        else:
            wrong = answer * 10 if k == len(_SLIPS) else Fraction(numbers[k - len(_SLIPS) - 1])
        if wrong != answer:
            return wrong
