"""The publisher's lean rollouts path sends the reference's events, byte for byte.

:func:`lines.lean_rollout_chunks` (the lean reader's columns, events joined by
:func:`encode_rollouts`) against :func:`lines.file_chunks` with :func:`rollout_event` (a
parse, the rules, :func:`encode_rollout` per line), on the lean reader's generated and hostile
lines (``tests/test_lean.py``) with agents of every kind, the bench shapes, bad lines and
refused sizes: the same events in the same chunks (``published_at`` aside), then the same
error. Shown to fail when a fault is planted.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rewardstream.contract import events as contract
from rewardstream.errors import LineError
from rewardstream.producers.events import rollout_event
from rewardstream.producers.publisher import lines as publisher_lines
from rewardstream.producers.publisher.lines import (
    MAX_MESSAGE_BYTES,
    MessageLimit,
    file_chunks,
    lean_rollout_chunks,
)
from tests.test_lean import ANSWER_KEYS, Pairs, bench_lines, lines, render

NO_LIMIT = MessageLimit("rewardstream.rollouts", MAX_MESSAGE_BYTES)
STAMP = b',"published_at":'


def _published(path: Path, answer_key: str | None, lean: bool, limit: MessageLimit) -> Any:
    """Every chunk's events (``published_at`` cut off, checked to be a float), then the
    error's text or None."""
    if lean:
        chunks = lean_rollout_chunks(path, "run-1", answer_key, limit)
    else:
        make = functools.partial(rollout_event, answer_key=answer_key)
        chunks = file_chunks(path, make, "run-1", limit)
    sent: list[list[tuple[bytes, bytes]]] = []
    try:
        for chunk in chunks:
            cut = []
            for key, value in chunk:
                head, stamp = value.rsplit(STAMP, 1)
                assert float(stamp[:-1]) > 0 and stamp.endswith(b"}")
                cut.append((key, head))
            sent.append(cut)
    except LineError as exc:
        return sent, str(exc)
    return sent, None


def same(path: Path, answer_key: str | None = None, limit: MessageLimit = NO_LIMIT) -> Any:
    lean = _published(path, answer_key, True, limit)
    reference = _published(path, answer_key, False, limit)
    assert lean == reference
    return lean


NAMES = st.one_of(
    st.sampled_from(["math_simple_agent", 'q"\\', "é", "", "%d", "],["]),
    st.text(max_size=5),
    st.sampled_from([None, 5, 2.5, True, [], ["a"], Pairs([]), Pairs([("name", "x")])]),
)
AGENTS = st.one_of(
    NAMES.map(lambda n: Pairs([("type", "responses_api_agents"), ("name", n)])),
    st.tuples(NAMES, NAMES).map(lambda n: Pairs([("name", n[0]), ("name", n[1])])),
    st.sampled_from([None, "agent", 3, [], Pairs([])]),
)


@st.composite
def agent_lines(draw: st.DrawFn) -> bytes:
    """:func:`tests.test_lean.lines` with an ``agent_ref`` first, last or twice, or none."""
    raw: bytes = draw(lines())
    if not raw.startswith(b"{") or raw == b"{}":
        return raw
    place = draw(st.sampled_from(["none", "first", "last", "twice"]))
    ascii_only = draw(st.booleans())
    ref = b'"agent_ref":' + render(draw(AGENTS), ascii_only)
    if place in ("first", "twice"):
        raw = b"{" + ref + b"," + raw[1:]
    if place in ("last", "twice"):
        other = b'"agent_ref":' + render(draw(AGENTS), ascii_only)
        raw = raw[:-1] + b"," + other + b"}"
    return raw


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(agent_lines(), min_size=1, max_size=12), ANSWER_KEYS, st.booleans())
@example([b'{"agent_ref":{"name":"a"},"_ng_task_index":1,"_ng_rollout_index":2}'], None, False)
@example([b'{"_ng_task_index":1,"_ng_rollout_index":2,"reward":1.0}', b""], None, True)
def test_a_file_is_published_as_the_reference_publishes_it(
    rows: list[bytes], answer_key: str | None, crlf: bool
) -> None:
    data = b"".join(row + (b"\r\n" if crlf else b"\n") for row in rows)
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as file:
        file.write(data)
        file.flush()
        same(Path(file.name), answer_key)


@pytest.mark.parametrize("shape", ["nemo", "hidden"])
def test_the_bench_shapes_are_published_as_the_reference_publishes_them(
    shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewardstream.infra import readers

    monkeypatch.setattr(readers, "_CHUNK", 8192)  # lines cross chunks of the file
    monkeypatch.setattr(publisher_lines, "CHUNK_EVENTS", 7)  # and events cross chunks of events
    results, _ = bench_lines(shape, 300)
    results[40] = results[40].replace(b'"reward":', b'"reward":[1],"x":', 1)  # a fallback
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n".join(results))  # no newline at the end
    sent, error = same(path, "extracted_answer")
    assert error is None and sum(map(len, sent)) == 300
    assert all(b'"agent":"' in value for chunk in sent for _, value in chunk)


def test_a_bad_line_and_a_refused_size_end_it_alike(tmp_path: Path) -> None:
    results, _ = bench_lines("nemo", 200)
    bad = list(results)
    bad[150] = b'{"reward":1.0,"x":{"y":1e400},"_ng_task_index":1,"_ng_rollout_index":0}'
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n".join(bad) + b"\n")
    sent, error = same(path)
    assert sum(map(len, sent)) == 150 and error is not None and "at line 151" in error
    long = list(results)
    long[120] = long[120].replace(b'"reward":', b'"long_one":' + b"7" * 90 + b'.5,"reward":', 1)
    path.write_bytes(b"\n".join(long) + b"\n")
    sizes = [len(k) + len(v) for chunk in same(path)[0] for k, v in chunk]
    others = max(sizes[:120] + sizes[121:])
    assert sizes[120] > others + 60  # published_at (cut off here) is ~30 bytes
    limit = MessageLimit("t", publisher_lines.RECORD_OVERHEAD + others + 40)
    # the size in the message counts published_at, whose digits may differ: compared apart
    lean_sent, lean_error = _published(path, None, True, limit)
    reference_sent, reference_error = _published(path, None, False, limit)
    assert lean_sent == reference_sent and sum(map(len, lean_sent)) == 120
    assert lean_error is not None and reference_error is not None
    assert "line 121: its event is" in lean_error
    assert lean_error.split(" bytes")[1:] == reference_error.split(" bytes")[1:]


def test_a_planted_fault_in_the_encoding_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results, _ = bench_lines("nemo", 20)
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n".join(results) + b"\n")
    same(path)
    encode = contract.encode_rollouts

    def swapped(*args: Any) -> list[bytes]:
        run_id, tasks, rollouts, *rest = args
        return encode(run_id, rollouts, tasks, *rest)  # task and rollout swapped

    monkeypatch.setattr(publisher_lines, "encode_rollouts", swapped)
    with pytest.raises(AssertionError):
        same(path)
