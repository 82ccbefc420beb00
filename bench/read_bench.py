"""Per-line cost of reading a collection, by stage, as ratios to ``orjson.loads`` of the same
lines in the same run (the floor any reader that parses its input pays).

    python -m bench.read_bench [--shape nemo|hidden] [--lines 20000] [--rounds 5] [--self-test]

Lines come from ``bench/generate.py`` (``result_row``/``input_row``), built in memory and
written once to a temporary file for the end-to-end stages. Stages, each the best of
``--rounds`` with the collector off (as in the batch workers): the floor; the reference
(``orjson.loads`` + ``row_key`` + ``extract_result``); the lean decode alone; the line check
(``lean.suspects``); the lean records (check + decode + extraction + ``rollout_infos``);
and each reader end to end on the file, storing included. Before timing, both readers'
states must be equal, and the lines the lean reader leaves to the reference are counted (0 on
these shapes). ``--self-test`` plants a line the check must flag, with the check disabled,
and fails unless the equality check catches it.
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.generate import input_row, result_row, text
from rewardstream.errors import LineError
from rewardstream.infra import readers
from rewardstream.processors.core import lean
from rewardstream.processors.core.lean_records import lean_results
from rewardstream.processors.core.records import extract_result
from rewardstream.processors.core.state import ProfileState, row_key, row_names

_CHUNK = 1 << 20  # as readers._CHUNK


def build(shape: str, n: int) -> tuple[bytes, bytes]:
    """``n`` rollouts lines and their ``n`` materialized rows, newline-ended."""
    rng = random.Random(0)
    bodies = [text(rng, 2000) for _ in range(256)]
    prompts = [text(rng, 180) for _ in range(64)]
    results, inputs = [], []
    for flat in range(n):
        t, r = divmod(flat, 8)
        prompt = prompts[t % 64] + f" #{t}"
        results.append(orjson.dumps(result_row(t, r, flat, prompt, bodies, shape=shape)))
        inputs.append(orjson.dumps(input_row(t, r, f"agent_{t % 3}", prompt)))
    return b"\n".join(results) + b"\n", b"\n".join(inputs) + b"\n"


class Lines:
    """A buffer's lines (no newline) as memoryviews, and its chunks of whole lines."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.array = np.frombuffer(data, np.uint8)
        ends = np.flatnonzero(self.array == 10)
        self.starts = np.r_[0, ends[:-1] + 1]
        self.ends = ends
        view = memoryview(data)
        self.views = [view[s:e] for s, e in zip(self.starts.tolist(), ends.tolist(), strict=True)]
        cuts = np.searchsorted(self.starts, np.arange(0, len(data), _CHUNK)).tolist()
        ranges = zip(cuts, [*cuts[1:], len(self.starts)], strict=True)
        self.chunks = [(a, b) for a, b in ranges if a < b]

    def check(self) -> int:
        """The line check over every chunk; the number of lines it flags."""
        flagged = 0
        for a, b in self.chunks:
            base = self.starts[a]
            buffer = self.array[base : self.ends[b - 1] + 1]
            flagged += len(lean.suspects(buffer, self.starts[a:b] - base, self.ends[a:b] - base))
        return flagged

    def lean_records(self, answer_key: str | None = None) -> int:
        """Check, decode and extract every line as the lean reader does; lines left over."""
        left = 0
        for a, b in self.chunks:
            base = self.starts[a]
            buffer = self.array[base : self.ends[b - 1] + 1]
            flagged = lean.suspects(buffer, self.starts[a:b] - base, self.ends[a:b] - base)
            for taken in lean_results(self.views[a:b], flagged, answer_key):
                left += isinstance(taken, int)
        return left


def _reference_results(lines: Lines) -> None:
    for view in lines.views:
        value = orjson.loads(view)
        task, rollout = row_key(value)
        extract_result(value, task, rollout)


def _reference_inputs(lines: Lines) -> None:
    for view in lines.views:
        value = orjson.loads(view)
        row_key(value)
        row_names(value)


def _floor(lines: Lines) -> None:
    loads = orjson.loads
    for view in lines.views:
        loads(view)


def _state(load: Callable[..., None], path: Path, *extra: Any) -> tuple[Any, ...]:
    state = ProfileState()
    try:
        load(state, path, 0, path.stat().st_size, *extra)
    except LineError as exc:
        return ("error", str(exc))
    header, sections = state.export_columns()
    return header, [bytes(s) for s in sections]


def same_states(results: Path, inputs: Path) -> bool:
    """Both readers give one state of each file."""
    return _state(readers.load_results_lean, results, None) == _state(
        readers.load_results_reference, results, None
    ) and _state(readers.load_inputs_lean, inputs) == _state(readers.load_inputs_reference, inputs)


def best(fn: Callable[[], object], rounds: int, count: int) -> float:
    """Microseconds per line, best of ``rounds`` (the collector off)."""
    times = []
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        gc.enable()
    return min(times) / count * 1e6


def self_test(results: bytes, inputs: bytes, folder: Path) -> None:
    """Plant a number beyond a double inside a skipped value, disable the line check, and
    require the equality check to see the readers disagree (and agree with the check on)."""
    bad = results.replace(b'"max_output_tokens":4096', b'"max_output_tokens":1e400', 1)
    assert bad != results, "the planted fault found no place"
    path, inputs_path = folder / "bad.jsonl", folder / "bad_inputs.jsonl"
    path.write_bytes(bad)
    inputs_path.write_bytes(inputs)
    if not same_states(path, inputs_path):
        raise SystemExit("self-test: the readers disagree with the line check on")
    saved = lean.suspects
    lean.suspects = lambda *_: set()
    try:
        caught = not same_states(path, inputs_path)
    finally:
        lean.suspects = saved
    if not caught:
        raise SystemExit("self-test FAILED: a line check that misses an overflow went unseen")
    print("self-test: a line check that misses an overflow is caught by the equality check")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=("nemo", "hidden"), default="nemo")
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--self-test", action="store_true", help="plant a fault; fail unless caught")
    a = ap.parse_args()
    results, inputs = build(a.shape, a.lines)
    with tempfile.TemporaryDirectory(prefix="read-bench-") as name:
        folder = Path(name)
        if a.self_test:
            self_test(results, inputs, folder)
            return
        results_path, inputs_path = folder / "r.jsonl", folder / "r_materialized_inputs.jsonl"
        results_path.write_bytes(results)
        inputs_path.write_bytes(inputs)
        if not same_states(results_path, inputs_path):
            raise SystemExit("the readers disagree: no timing")
        out, ins = Lines(results), Lines(inputs)
        n = len(out.views)
        print(
            f"{a.shape} shape, {n} lines ({len(results) / n:.0f} B a rollouts line, "
            f"{len(inputs) / n:.0f} B an inputs line), best of {a.rounds}; "
            f"lines the line check flags: {out.check()} + {ins.check()}, "
            f"rollouts lines left to the reference: {out.lean_records()}"
        )

        def load(fn: Callable[..., None], path: Path, *extra: Any) -> Callable[[], None]:
            return lambda: fn(ProfileState(), path, 0, path.stat().st_size, *extra)

        stages: list[tuple[str, Lines, Callable[[], object]]] = [
            ("rollouts: orjson.loads (floor)", out, lambda: _floor(out)),
            (
                "rollouts: reference (loads + row_key + extract_result)",
                out,
                lambda: _reference_results(out),
            ),
            ("rollouts: lean decode", out, lambda: [lean.decode_result(v) for v in out.views]),
            ("rollouts: line check", out, out.check),
            ("rollouts: lean records (check + decode + extract)", out, out.lean_records),
            (
                "rollouts: reference reader, end to end",
                out,
                load(readers.load_results_reference, results_path, None),
            ),
            (
                "rollouts: lean reader, end to end",
                out,
                load(readers.load_results_lean, results_path, None),
            ),
            ("inputs: orjson.loads (floor)", ins, lambda: _floor(ins)),
            (
                "inputs: reference (loads + row_key + row_names)",
                ins,
                lambda: _reference_inputs(ins),
            ),
            ("inputs: lean decode", ins, lambda: [lean.decode_input(v) for v in ins.views]),
            (
                "inputs: reference reader, end to end",
                ins,
                load(readers.load_inputs_reference, inputs_path),
            ),
            ("inputs: lean reader, end to end", ins, load(readers.load_inputs_lean, inputs_path)),
        ]
        floors: dict[int, float] = {}
        for label, lines, fn in stages:
            us = best(fn, a.rounds, len(lines.views))
            floor = floors.setdefault(id(lines), us)
            print(f"{label:58s} {us:7.2f} us a line  {us / floor:5.2f}x the floor")


if __name__ == "__main__":
    main()
