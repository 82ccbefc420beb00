"""The bundled environment: arithmetic word problems, generated, solved and verified exactly.

One table of templates serves three purposes, so they cannot drift apart: generating the
dataset (``gym_servers/data/arithmetic.jsonl``), solving a problem from its text (the simulated
policy reads the question like a model would, it is not handed the answer), and knowing how
many steps a problem takes (its difficulty).

    python -m rewardstream.gym_servers.math_env --count 300 --seed 0 \
        --out gym_servers/data/arithmetic.jsonl
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import orjson

__all__ = [
    "AGENT_NAME",
    "DATASET",
    "SYSTEM_PROMPT",
    "Solved",
    "extract_answer",
    "format_number",
    "generate",
    "parse_number",
    "response_text",
    "solve",
    "verify",
]

DATASET = Path(__file__).resolve().parent / "data" / "arithmetic.jsonl"
AGENT_NAME = "arithmetic_simple_agent"
SYSTEM_PROMPT = (
    "Solve the arithmetic word problem. Think step by step, then give the final answer as a "
    "plain number inside \\boxed{}."
)
_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas")


class _Template(NamedTuple):
    name: str
    text: str  # {name} is a person, every other field an integer
    steps: int  # operations a solver performs: the main driver of difficulty
    draw: Callable[[random.Random, int], dict[str, int]]  # numbers for a difficulty level 1..5
    answer: Callable[[dict[str, int]], Fraction]


def _n(rng: random.Random, level: int, low: int = 2) -> int:
    return rng.randint(low, 5 * 10 ** ((level + 1) // 2))


_TEMPLATES = (
    _Template(
        "expression",
        "Compute {a} + {b} * {c} - {d}.",
        3,
        lambda r, lv: {"a": _n(r, lv), "b": _n(r, lv), "c": r.randint(2, 9 + lv), "d": _n(r, lv)},
        lambda v: Fraction(v["a"] + v["b"] * v["c"] - v["d"]),
    ),
    _Template(
        "shopping",
        "{name} has {a} apples and buys {b} bags with {c} apples in each bag. "
        "How many apples does {name} have now?",
        2,
        lambda r, lv: {"a": _n(r, lv), "b": r.randint(2, 3 + 2 * lv), "c": r.randint(2, 6 * lv)},
        lambda v: Fraction(v["a"] + v["b"] * v["c"]),
    ),
    _Template(
        "travel",
        "A train travels at {a} km per hour for {b} hours. How many kilometres does it travel?",
        1,
        lambda r, lv: {"a": r.randint(20, 40 * lv), "b": r.randint(2, 2 + 2 * lv)},
        lambda v: Fraction(v["a"] * v["b"]),
    ),
    _Template(
        "leftover",
        "A baker made {a} cookies and packs them into boxes of {b}. How many cookies are left "
        "over after filling as many boxes as possible?",
        2,
        lambda r, lv: {"a": _n(r, lv, 20), "b": r.randint(3, 4 + 3 * lv)},
        lambda v: Fraction(v["a"] % v["b"]),
    ),
    _Template(
        "spending",
        "{name} had {a} dollars, spent {b} dollars on a book and {c} dollars on lunch. "
        "How many dollars does {name} have left?",
        2,
        lambda r, lv: {"a": 60 + _n(r, lv), "b": r.randint(5, 30), "c": r.randint(5, 30)},
        lambda v: Fraction(v["a"] - v["b"] - v["c"]),
    ),
    _Template(
        "garden",
        "A garden is {a} metres long and {b} metres wide. A path covers {c} square metres of "
        "it. How many square metres are left for planting?",
        2,
        lambda r, lv: {
            "a": r.randint(5, 10 * lv),
            "b": r.randint(5, 10 * lv),
            "c": r.randint(1, 9),
        },
        lambda v: Fraction(v["a"] * v["b"] - v["c"]),
    ),
    _Template(
        "discount",
        "A jacket costs {a} dollars and is sold at {p} percent off. What is the sale price in "
        "dollars?",
        3,
        lambda r, lv: {"a": r.randint(10, 60 * lv), "p": 5 * r.randint(1, 3 + 2 * lv)},
        lambda v: Fraction(v["a"] * (100 - v["p"]), 100),
    ),
)


def _pattern(text: str) -> re.Pattern[str]:
    """The template's text as a regex: ``{name}`` a capitalized word, other fields integers."""
    out, seen = "", set()
    for literal, field in re.findall(r"([^{]*)(?:\{(\w+)\})?", text):
        out += re.escape(literal)
        if field:
            out += (
                f"(?P={field})"
                if field in seen
                else (rf"(?P<{field}>[A-Z][a-z]+)" if field == "name" else rf"(?P<{field}>-?\d+)")
            )
            seen.add(field)
    return re.compile(out)


_PATTERNS = [(t, _pattern(t.text)) for t in _TEMPLATES]


class Solved(NamedTuple):
    """A problem read from its text: the exact answer, its steps and how many digits it has."""

    answer: Fraction
    steps: int
    digits: int


def solve(question: str) -> Solved | None:
    """Solve a problem of the bundled kind from its text, or None for anything else."""
    for template, pattern in _PATTERNS:
        m = pattern.search(question)
        if m is not None:
            values = {k: int(v) for k, v in m.groupdict().items() if k != "name"}
            digits = sum(len(str(abs(v))) for v in values.values())
            return Solved(template.answer(values), template.steps, digits)
    return None


def format_number(value: Fraction) -> str:
    """``42``, ``-3`` or ``37.5``: the exact decimal (the denominators divide a power of 10)."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.12f}".rstrip("0")
    if Fraction(text) != value:
        raise ValueError(f"{value} has no short exact decimal")
    return text


def generate(count: int, seed: int) -> Iterator[dict[str, Any]]:
    """``count`` problems in NeMo Gym's input JSONL shape, deterministic for ``seed``."""
    rng = random.Random(seed)
    seen: set[str] = set()
    i = 0
    while len(seen) < count:
        template = _TEMPLATES[i % len(_TEMPLATES)]
        level = 1 + rng.randrange(5)
        values = template.draw(rng, level)
        question = template.text.format(**values, name=rng.choice(_NAMES))
        # identical lines would be one task (docs/nemo-gym-compat.md §Materialization)
        if question in seen:
            continue
        seen.add(question)
        i += 1
        yield {
            "responses_create_params": {
                "input": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": question},
                ]
            },
            "expected_answer": format_number(template.answer(values)),
            "verifier_metadata": {"template": template.name, "level": level},
            "agent_ref": {"type": "responses_api_agents", "name": AGENT_NAME},
        }


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The last ``\\boxed{...}`` content, else the last number in the text, else None."""
    boxed = _BOXED.findall(text)
    if boxed:
        return str(boxed[-1]).strip()
    numbers = _NUMBER.findall(text)
    return str(numbers[-1]) if numbers else None


def parse_number(text: str) -> Fraction | None:
    """An extracted answer as an exact number (``$1,250.50`` -> 2501/2), or None."""
    cleaned = text.replace(",", "").replace("$", "").strip()
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def response_text(response: Any) -> str:
    """The assistant's text in a Responses object (every ``output_text`` of every message)."""
    parts: list[str] = []
    output = response.get("output") if isinstance(response, dict) else None
    for item in output if isinstance(output, list) else ():
        if isinstance(item, dict) and item.get("type") == "message":
            for content in item.get("content") or ():
                if isinstance(content, dict) and content.get("type") == "output_text":
                    parts.append(str(content.get("text", "")))
    return "\n".join(parts)


def verify(response: Any, expected_answer: str) -> dict[str, Any]:
    """``reward``, ``is_correct`` and ``extracted_answer`` for one response: exact comparison."""
    extracted = extract_answer(response_text(response))
    value = None if extracted is None else parse_number(extracted)
    correct = value is not None and value == parse_number(expected_answer)
    return {"reward": 1.0 if correct else 0.0, "is_correct": correct, "extracted_answer": extracted}


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the bundled arithmetic dataset.")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DATASET)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("wb") as fh:
        for row in generate(args.count, args.seed):
            fh.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))


if __name__ == "__main__":
    main()
