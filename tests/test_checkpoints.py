"""A unit held again from its checkpoint, then fed the rest of its log, writes the very files a
processor that never stopped writes; a checkpoint that is not whole is refused, nothing held."""

from __future__ import annotations

import random
import sys
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardstream.contract.events import EventKind
from rewardstream.processors.engine.checkpoints import (
    CheckpointError,
    decode_unit,
    encode_unit,
    pieces,
)
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import Unit, _KeySet
from rewardstream.processors.inprocess import finish
from tests.golden import OUTPUT_SUFFIXES, GoldenCase, golden_events, profiled_cases

CASES = profiled_cases()
Event = tuple[EventKind, bytes, str | None, int]  # kind, bytes, unit, offset


def _log(case: GoldenCase, seed: int) -> list[Event]:
    """The case's events shuffled (rollouts before their rows, too), over two partitions per
    topic by task parity, with each unit's offsets; control events last but RunStarted."""
    events = golden_events(case, "run-1", finish=case.name.endswith("+allow_partial"))
    data = [(k, raw) for k, raw in events if k != "control"]
    random.Random(seed).shuffle(data)
    control = [(k, raw) for k, raw in events if k == "control"]
    offsets: dict[str, int] = {}
    out: list[Event] = [("control", control[0][1], None, 0)]
    for kind, raw in data:
        unit = f"{kind}-{_task(raw) % 2}"
        offsets[unit] = offsets.get(unit, -1) + 1
        out.append((kind, raw, unit, offsets[unit]))
    return out + [("control", raw, None, i) for i, (_, raw) in enumerate(control[1:], 1)]


def _task(raw: bytes) -> int:
    import orjson

    event = orjson.loads(raw)
    return int(event["task"] if "task" in event else event["row"]["_ng_task_index"])


def _feed(pipeline: Pipeline, events: list[Event]) -> None:
    for kind, raw, unit, offset in events:
        run = pipeline.handle(kind, raw, unit, offset if unit else None)
        if unit is not None:
            pipeline.units[unit].position = offset + 1
        if run is not None:
            finish(pipeline, run)


def _blob(unit: Unit) -> bytes | None:
    """The unit's checkpoint, its pieces put back together as a restore does."""
    buffers = encode_unit(unit, {})
    return None if buffers is None else b"".join(pieces(buffers, 4096))


def _restore(pipeline: Pipeline, name: str, blob: bytes) -> list[str]:
    """Hold the new unit ``name`` again from ``blob``, as a processor does."""
    checkpoint = decode_unit(blob, name)
    return pipeline.restore(name, checkpoint, checkpoint.built(pipeline.unit(name)))


def _files(folder: Path, case: GoldenCase) -> dict[str, bytes]:
    return {s: (folder / "run-1" / f"{case.stem}{s}").read_bytes() for s in OUTPUT_SUFFIXES}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_unit_held_again_from_its_checkpoint_goes_on_as_if_never_stopped(
    case: GoldenCase, seed: int, tmp_path: Path
) -> None:
    """Each topic's units checkpointed at another point of the log (as two owners' commits
    fall): a rollout held at one whose row the other holds counts once both are back."""
    log, rng = _log(case, seed), random.Random(seed)
    cuts = sorted(rng.randint(1, max(1, len(log) - 2)) for _ in range(2))
    kinds = ["input", "rollout"] if seed % 2 else ["rollout", "input"]
    with Pipeline(tmp_path / "whole") as whole:
        _feed(whole, log)
    blobs: dict[str, bytes] = {}
    with Pipeline(tmp_path / "a") as first, Pipeline(tmp_path / "b") as second:
        for lo, hi, kind in zip([0, cuts[0]], cuts, kinds, strict=True):
            _feed(first, log[lo:hi])
            for name in sorted(first.units):
                if name.startswith(kind):
                    blob = _blob(first.units[name])
                    assert blob is not None
                    blobs[name] = blob
        _feed(second, [e for e in log[: cuts[1]] if e[2] is None])  # control: everyone's
        for name in sorted(blobs, reverse=seed > 2):
            _restore(second, name, blobs[name])
        for unit in ("input-0", "input-1", "rollout-0", "rollout-1"):
            second.unit(unit)  # one without a checkpoint: new, read from its start
        at = {n: u.position for n, u in second.units.items()}
        rest = [e for i, e in enumerate(log) if (e[3] >= at[e[2]] if e[2] else i >= cuts[1])]
        _feed(second, rest)
    assert _files(tmp_path / "b", case) == _files(tmp_path / "whole", case)


def test_a_unit_held_again_keeps_no_view_of_its_checkpoint(tmp_path: Path) -> None:
    """Its ``rollout_infos`` entries go to its spill, as folding moves them there: a view of
    the checkpoint kept in its state would keep all of the checkpoint in memory."""
    log = _log(CASES[0], 1)
    with Pipeline(tmp_path / "a") as first, Pipeline(tmp_path / "b") as second:
        last = max(i for i, e in enumerate(log) if e[0] == "rollout")
        _feed(first, log[:last] + log[last + 1 :])  # one rollout short: the run stays open
        _feed(second, [e for e in log if e[2] is None][:1])
        assert {"input-0", "rollout-0"} <= set(first.units)
        for name in sorted(first.units):
            blob = _blob(first.units[name])
            assert blob is not None
            alone = sys.getrefcount(blob)
            assert _restore(second, name, blob)
            assert sys.getrefcount(blob) == alone, name


def _some_unit(tmp_path: Path) -> tuple[Pipeline, bytes, str]:
    case = CASES[0]
    pipeline = Pipeline(tmp_path / "a")
    _feed(pipeline, _log(case, 1)[: len(_log(case, 1)) // 2])
    name = sorted(pipeline.units)[0]
    blob = _blob(pipeline.units[name])
    assert blob is not None
    return pipeline, blob, name


def test_a_checkpoint_not_whole_or_not_the_units_is_refused(tmp_path: Path) -> None:
    pipeline, blob, name = _some_unit(tmp_path)
    pipeline.close()
    head_end = blob.index(b"\n") + 1
    for bad, why in [
        (blob[:-1], "truncated"),
        (blob + b"x", "past its parts"),
        (blob[: head_end + 20] + b"\xff" + blob[head_end + 21 :], "unusable"),
        (b"{}\n" + blob[head_end:], "not a rewardstream.checkpoint"),
    ]:
        with pytest.raises(CheckpointError, match=why):
            decode_unit(bad, name)
    with pytest.raises(CheckpointError, match=f"of '{name}', not 'rollout-7'"):
        decode_unit(blob, "rollout-7")


def test_a_checkpoint_that_does_not_fit_its_state_leaves_the_unit_new(tmp_path: Path) -> None:
    first, blob, name = _some_unit(tmp_path)
    first.close()
    checkpoint = decode_unit(blob, name)
    run_id, (seen, held) = next(iter(checkpoint.parts.items()))
    bad = checkpoint._replace(parts={run_id: (seen, held._replace(foreign=held.foreign + 1))})
    with Pipeline(tmp_path / "b") as second:
        unit = second.unit(name)
        with pytest.raises(ValueError, match="left out"):
            bad.built(unit)
        assert not unit.parts and unit.position == 0 and run_id not in second.runs
        assert not list((tmp_path / "b").rglob("*.spill"))  # what it built is gone


def _spills(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.spill"))


def test_parts_built_for_a_unit_revoked_meanwhile_are_dropped(tmp_path: Path) -> None:
    """A rebalance while the parts were built off the event loop: the unit is not this
    processor's (or not new) any more, so nothing is attached and the built spills go."""
    log = _log(CASES[0], 1)
    last = max(i for i, e in enumerate(log) if e[0] == "rollout")
    with Pipeline(tmp_path / "a") as first:
        _feed(first, log[:last] + log[last + 1 :])  # one rollout short: open
        name = "input-0"
        blob = _blob(first.units[name])
        assert blob is not None
    checkpoint = decode_unit(blob, name)
    with Pipeline(tmp_path / "b") as second:
        parts = checkpoint.built(second.unit(name))
        assert _spills(tmp_path / "b")
        second.release(name)
        with pytest.raises(ValueError, match="not a new one"):
            second.restore(name, checkpoint, parts)
        assert name not in second.units and not _spills(tmp_path / "b")
        again = second.unit(name)
        again.position = 1  # placed meanwhile: not new either
        with pytest.raises(ValueError, match="not a new one"):
            second.restore(name, checkpoint, checkpoint.built(again))
        assert not second.units[name].parts and not _spills(tmp_path / "b")


def test_a_checkpoint_past_the_cut_of_a_run_final_meanwhile_is_refused(tmp_path: Path) -> None:
    """A run that became final after the checkpoint was written: its events between the
    terminal record's cut and the checkpoint's position are late (parked on a replay), so a
    checkpoint past the cut would lose them; one at or before it is used, the run left out."""
    case = CASES[0]
    log = _log(case, 1)
    with Pipeline(tmp_path / "whole") as whole:
        _feed(whole, log)
        done = whole.runs["run-1"].terminal
        assert done is not None
        cuts = dict(done.cuts)
    last, name = max(i for i, e in enumerate(log) if e[0] == "rollout"), "input-0"
    with Pipeline(tmp_path / "a") as first:
        _feed(first, log[:last] + log[last + 1 :])  # one rollout short: open, rows all there
        blob = _blob(first.units[name])
        assert blob is not None and first.units[name].position == cuts[name]
    control = [e for e in log if e[2] is None]
    for cut, used in ((cuts[name] - 1, False), (first.units[name].position, True)):
        folder = tmp_path / f"cut{cut}"
        with Pipeline(folder) as second:
            _feed(second, control[:1])  # RunStarted, then its terminal record, ``cut`` here
            second.mark_final("run-1", done._replace(cuts={**cuts, name: cut}))
            if used:
                assert _restore(second, name, blob) == []  # the final run left out
            else:
                with pytest.raises(ValueError, match="past where the terminal record"):
                    _restore(second, name, blob)
            assert not second.units[name].parts and not _spills(folder)


def test_a_unit_holding_an_offsetless_rollout_has_no_checkpoint(tmp_path: Path) -> None:
    case = CASES[0]
    events = golden_events(case, "run-1", finish=False)
    raw = next(raw for kind, raw in events if kind == "rollout")
    with Pipeline(tmp_path) as pipeline:
        pipeline.handle("rollout", raw, "rollout-0")  # in process: no offset, no row yet
        assert pipeline.units["rollout-0"].parts["run-1"].unmatched
        assert _blob(pipeline.units["rollout-0"]) is None


def test_a_key_held_again_with_other_content_is_a_conflict_not_a_duplicate(
    tmp_path: Path,
) -> None:
    """The content digests come back with the state: the same key with the same content is a
    duplicate, with other content a conflict (parked), as before the restart."""
    log = _log(CASES[0], 1)
    last = max(i for i, e in enumerate(log) if e[0] == "rollout")
    with Pipeline(tmp_path / "a") as first, Pipeline(tmp_path / "b") as second:
        _feed(first, log[:last] + log[last + 1 :])  # one rollout short: open
        kind, raw, name, offset = next(e for e in log if e[0] == "rollout")
        assert name is not None and first.runs["run-1"].terminal is None
        blob = _blob(first.units[name])
        assert blob is not None
        _feed(second, [e for e in log if e[2] is None])  # control: every processor's
        _restore(second, name, blob)
        part = second.units[name].parts["run-1"]
        assert (part.duplicates, part.conflicts) == (0, 0)
        second.handle(kind, raw, name, offset)
        other = raw.replace(b'"reward":', b'"reward":1e9,"was":', 1)
        second.handle(kind, other, name, offset + 1000)
        assert (part.duplicates, part.conflicts) == (1, 1)
        assert [r.reason for r in second.take_rejected()] == ["conflict"]


@settings(deadline=None, max_examples=200)
@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(-2, 70)), max_size=60))
def test_a_key_set_built_from_columns_is_the_one_added_key_by_key(
    keys: list[tuple[int, int]],
) -> None:
    """:meth:`_KeySet.of` (numpy, rollouts below 63) and key by key agree, a repeat refused."""
    tasks, rollouts = array("q", [t for t, _ in keys]), array("q", [r for _, r in keys])
    built, added = _KeySet.of(tasks, rollouts), _KeySet()
    fresh = [added.add(t, r) for t, r in keys]
    if not all(fresh):
        assert built is None
        return
    assert built is not None
    probe = {(t, r) for t in range(-6, 7) for r in range(-3, 72)}
    assert {k for k in probe if k in built} == {k for k in probe if k in added} == set(keys)


@settings(deadline=None, max_examples=200)
@given(
    st.lists(st.binary(max_size=40) | st.lists(st.integers(-9, 9), max_size=9), max_size=8),
    st.integers(1, 17),
)
def test_pieces_are_the_buffers_back_to_back_cut_to_size(
    chunks: list[bytes | list[int]], size: int
) -> None:
    buffers = [array("q", c) if isinstance(c, list) else c for c in chunks]
    got = list(pieces(buffers, size))
    whole = b"".join(bytes(b) if isinstance(b, bytes) else b.tobytes() for b in buffers)
    assert b"".join(got) == whole
    assert all(len(p) == size for p in got[:-1]) and all(0 < len(p) <= size for p in got)
