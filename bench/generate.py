"""Write a realistic NeMo Gym collection for benchmarks: materialized inputs + shuffled rollouts.

Default: 100,000 tasks x 8 rollouts, ~2 KB of response text each (~2.7 GB of rollouts,
~0.4 GB of materialized inputs). Rows have NeMo Gym's shape (docs/nemo-gym-compat.md §Result
rows): the full rcp, a Responses object with usage, reward, verifier fields, stamps.
Deterministic for a seed.
``--shape hidden`` is the other shape profiles see: two agents, a continuous reward and ~10
numeric verifier fields per rollout (scores, counts, latencies, a bool), instead of three
agents, a binary reward and two.

    python bench/generate.py --tasks 100000 --repeats 8 --out bench/data/large [--shape hidden]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import orjson

AGENTS = ("math_simple_agent", "code_simple_agent", "tool_simple_agent")
HIDDEN_AGENTS = ("policy_simple_agent", "judge_simple_agent")
SHAPES = ("nemo", "hidden")
WORDS = [
    "the",
    "answer",
    "follows",
    "from",
    "the",
    "equation",
    "so",
    "we",
    "compute",
    "each",
    "term",
    "carefully",
    "and",
    "then",
    "sum",
    "them",
    "to",
    "get",
    "the",
    "final",
    "value",
    "which",
    "we",
    "check",
    "against",
    "the",
    "constraint",
    "before",
    "reporting",
    "it",
]


def text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        w = WORDS[rng.randrange(len(WORDS))]
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def input_row(task: int, rollout: int, agent: str, prompt: str) -> dict[str, object]:
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are a careful solver. Think step by step."},
                {"role": "user", "content": prompt},
            ],
            "max_output_tokens": 4096,
            "temperature": 1.0,
            "top_p": 0.95,
        },
        "verifier_metadata": {"expected_answer": str(task % 97), "difficulty": task % 5},
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }


def _agent(t: int, shape: str) -> str:
    agents = HIDDEN_AGENTS if shape == "hidden" else AGENTS
    return agents[t % len(agents)]


def hidden_fields(t: int, r: int, h: int) -> dict[str, object]:
    """The hidden shape's verifier fields: a continuous reward and ~10 numbers."""
    quality = ((t * 7919) % 100) / 100
    noise = ((h >> 8) % 1000) / 1000
    return {
        "reward": round(0.7 * quality + 0.3 * noise, 6),
        "format_score": (h % 997) / 997,
        "rubric_score": ((h >> 4) % 101) / 100,
        "length_penalty": -((h >> 12) % 50) / 100,
        "num_tool_calls": (h >> 3) % 7,
        "num_turns": 1 + (h >> 5) % 4,
        "verifier_latency_ms": 20.0 + (h % 5000) / 10,
        "judge_agreement": ((h >> 7) % 3) / 2,
        "is_valid": (h >> 9) % 10 != 0,
        "edit_distance": (h >> 11) % 300,
        "partial_credit": round(quality * noise, 6),
    }


def generate(
    tasks: int, repeats: int, out: Path, text_bytes: int, seed: int, shape: str = "nemo"
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    prompts = [text(rng, 180) for _ in range(64)]
    bodies = [text(rng, text_bytes) for _ in range(256)]
    inputs = out.with_name(f"{out.name}_materialized_inputs.jsonl")
    with open(inputs, "wb") as fh:
        for t in range(tasks):
            row = input_row(t, 0, _agent(t, shape), prompts[t % 64] + f" #{t}")
            for r in range(repeats):
                row["_ng_rollout_index"] = r
                fh.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    order = np.random.default_rng(seed).permutation(tasks * repeats)
    with open(out.with_name(f"{out.name}.jsonl"), "wb") as fh:
        for flat in order.tolist():
            t, r = divmod(flat, repeats)
            result = result_row(t, r, flat, prompts[t % 64] + f" #{t}", bodies, shape=shape)
            fh.write(orjson.dumps(result, option=orjson.OPT_APPEND_NEWLINE))


def result_row(
    t: int, r: int, flat: int, prompt: str, bodies: list[str], salt: int = 0, shape: str = "nemo"
) -> dict[str, object]:
    """Rollout ``r`` of task ``t`` (the ``flat``-th of its collection): a NeMo Gym result
    with usage, reward and verifier fields, deterministic for (t, r, salt)."""
    h = (t * 2654435761 + r * 40503 + salt) & 0xFFFFFFFF
    p_correct = 0.2 + 0.6 * ((t * 7919) % 100) / 100
    correct = (h % 1000) / 1000 < p_correct
    in_tok = 150 + t % 300
    out_tok = 200 + h % 1800
    row = input_row(t, r, _agent(t, shape), prompt)
    verdict: dict[str, object] = {
        "reward": 1.0 if correct else 0.0,
        "is_correct": correct,
        "extracted_answer": str(t % 97 if correct else h % 97),
        "judge_score": (h % 10007) / 10007,
    }
    if shape == "hidden":
        verdict = hidden_fields(t, r, h) | {"extracted_answer": verdict["extracted_answer"]}
    return {
        "responses_create_params": row["responses_create_params"],
        "response": {
            "id": f"resp_{t}_{r}",
            "created_at": 1760000000.0 + flat,
            "model": "policy_model",
            "object": "response",
            "output": [
                {
                    "id": f"msg_{t}_{r}",
                    "content": [
                        {"annotations": [], "text": bodies[h % len(bodies)], "type": "output_text"}
                    ],
                    "role": "assistant",
                    "status": "completed",
                    "type": "message",
                }
            ],
            "usage": {
                "input_tokens": in_tok,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out_tok,
                "output_tokens_details": {"reasoning_tokens": h % 64},
                "total_tokens": in_tok + out_tok,
            },
        },
        **verdict,
        "verifier_metadata": row["verifier_metadata"],
        "_ng_task_index": t,
        "_ng_rollout_index": r,
        "agent_ref": row["agent_ref"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--text-bytes", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/data/large"), help="rollouts stem")
    ap.add_argument("--shape", choices=SHAPES, default="nemo")
    a = ap.parse_args()
    generate(a.tasks, a.repeats, a.out, a.text_bytes, a.seed, a.shape)


if __name__ == "__main__":
    main()
