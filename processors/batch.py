"""``ng_reward_profile``: profile a materialized-inputs file and a rollouts file.

The rollouts file is streamed line by line into a :class:`ProfileState`; materialized rows are
kept only as byte offsets, read back for ``sample`` at write time.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import mmap
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm import tqdm

from rewardstream.errors import InputError, LineError
from rewardstream.infra import readers
from rewardstream.infra.forking import fork
from rewardstream.infra.jsonl import check_input_file, count_lines, split_ranges
from rewardstream.processors.core.confseq import DEFAULT_LEVEL
from rewardstream.processors.core.profile import Profile, TaskRows, build_profile
from rewardstream.processors.core.state import ProfileState
from rewardstream.sinks.files import (
    Aggregates,
    InputsFile,
    ProfilePaths,
    summary_lines,
    task_lines,
    write_profile,
)

__all__ = ["ProfileConfig", "load_state", "print_summary", "run_profile"]


class ProfileConfig(BaseModel):
    """NeMo Gym's config keys for ``gym eval profile``, plus ``quiet`` for the progress bar and
    rewardstream's ``aggregate_metrics`` (pass@k and friends, task difficulty, intervals) with
    the ``answer_key`` that majority@k votes on and the intervals' ``interval_level``."""

    model_config = ConfigDict(extra="forbid")

    materialized_inputs_jsonl_fpath: Path
    rollouts_jsonl_fpath: Path
    allow_partial_rollouts: bool = False
    quiet: bool = False
    aggregate_metrics: bool = False
    answer_key: str | None = None
    interval_level: float | None = Field(default=None, gt=0, lt=1)  # default DEFAULT_LEVEL

    @model_validator(mode="after")
    def _extras_need_aggregates(self) -> ProfileConfig:
        for key in ("answer_key", "interval_level"):
            if getattr(self, key) is not None and not self.aggregate_metrics:
                raise ValueError(f"+{key} applies with +aggregate_metrics=true")
        return self


_PARALLEL_MIN_BYTES = 64 << 20  # below this, worker start-up costs more than it saves
_PART_BYTES = 64 << 20  # a worker maps one part at a time: this bounds its file-backed RSS


Part = tuple[str, Path, int, int, str | None, str | None]
"""A worker's share: (kind, file, start, end, answer key, the folder its rollout infos go to)."""


def _load_part(
    kind: str,
    path: Path,
    start: int,
    end: int,
    answer_key: str | None = None,
    spill: str | None = None,
) -> tuple[ProfileState, str | None]:
    """One worker's share: the rows or results of one byte range of one file, and (given a
    ``spill`` folder) the file its ``rollout_infos`` entries were moved to: the parent maps
    them instead of receiving and holding them (most of the state's bytes).

    The cyclic garbage collector is off meanwhile: parsed rows hold no cycles (refcounting
    frees them), and its passes over the growing heap cost ~3 us per rollout line (measured).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        state = _load(kind, path, start, end, answer_key)
    finally:
        if enabled:
            gc.enable()
    if spill is None or not state.info_size:
        return state, None
    fd, name = tempfile.mkstemp(prefix="infos-", dir=spill)
    with os.fdopen(fd, "wb") as fh:
        fh.write(state.take_infos())
    return state, name


def _load(kind: str, path: Path, start: int, end: int, answer_key: str | None) -> ProfileState:
    state = ProfileState()
    if kind == "inputs":
        readers.load_inputs(state, path, start, end)
    else:
        readers.load_results(state, path, start, end, answer_key)
    return state


def _parts(path: Path, kind: str, workers: int, answer_key: str | None = None) -> list[Part]:
    size = os.path.getsize(path)
    n = 1 if workers <= 1 or size < _PARALLEL_MIN_BYTES else max(workers * 4, size // _PART_BYTES)
    return [(kind, path, a, b, answer_key, None) for a, b in split_ranges(path, n)]


def load_state(
    inputs: Path,
    rollouts: Path,
    quiet: bool = True,
    workers: int = 0,
    answer_key: str | None = None,
) -> ProfileState:
    """Read both files into one state (inputs first, as NeMo Gym does).

    Large files are cut into line-aligned byte ranges parsed by ``workers`` processes (default:
    one per core); their states are merged in file order, so the result equals one pass.
    ``answer_key``: keep each result's answer identity, for majority@k.
    """
    check_input_file(inputs, "--inputs")
    check_input_file(rollouts, "--rollouts")
    workers = workers or os.cpu_count() or 1
    parts = _parts(inputs, "inputs", workers) + _parts(rollouts, "rollouts", workers, answer_key)
    state = ProfileState()
    total = sum(part[3] - part[2] for part in parts)
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=f"profiling {rollouts.name}",
        disable=quiet or not sys.stderr.isatty(),
        mininterval=0.5,
    )
    with bar, contextlib.ExitStack() as stack:
        if len(parts) > 2:
            # the workers' rollout infos: mapped here, their files unlinked on the way out
            spill = stack.enter_context(tempfile.TemporaryDirectory(prefix="rewardstream-"))
            parts = [(*part[:5], spill) for part in parts]
            pool = stack.enter_context(
                ProcessPoolExecutor(
                    workers,
                    mp_context=multiprocessing.get_context("fork"),
                    initializer=signal.signal,  # the parent's SIGTERM handler is the parent's
                    initargs=(signal.SIGTERM, signal.SIG_DFL),
                )
            )
            results: Iterator[tuple[ProfileState, str | None]] = pool.map(
                _load_part, *zip(*parts, strict=True)
            )
        else:
            results = (_load_part(*part) for part in parts)
        for part, (loaded, spilled) in zip(parts, _renumbered(results, parts), strict=True):
            state.merge(loaded, taken_infos=_mapped(spilled) if spilled else b"")
            bar.update(part[3] - part[2])
    return state


def _mapped(path: str) -> mmap.mmap:
    """A worker's spilled rollout infos, mapped read-only (valid after the file is removed).

    Mapped pages are clean page cache: counted in RSS once touched (under Linux 6.18 on ext4
    a fault maps a whole large folio, ~0.8 MB measured, so the task rows' scattered reads
    soon map all of it, and ``madvise`` cannot keep it down), but never anonymous memory.
    Reading each entry with ``pread`` instead kept RSS 140 MB lower at 100,000 tasks x 8 and
    cost ~1 us more per entry, 0.7-1.5 s of the run (measured): not worth it.
    """
    with open(path, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def _renumbered(
    results: Iterator[tuple[ProfileState, str | None]], parts: list[Part]
) -> Iterator[tuple[ProfileState, str | None]]:
    """Re-raise a worker's line error with its line number counted from the file start."""
    for _, path, start, *_ in parts:
        try:
            yield next(results)
        except LineError as exc:
            raise exc.shifted(count_lines(path, start)) from None


def run_profile(config: ProfileConfig) -> tuple[Profile, ProfilePaths]:
    """Profile, write the three files, and return what was written (for the summary)."""
    state = load_state(
        config.materialized_inputs_jsonl_fpath,
        config.rollouts_jsonl_fpath,
        config.quiet,
        answer_key=config.answer_key,
    )
    profile = build_profile(state, config.allow_partial_rollouts)
    paths = ProfilePaths.next_to(config.rollouts_jsonl_fpath)
    aggregates = None
    if config.aggregate_metrics:
        level = DEFAULT_LEVEL if config.interval_level is None else config.interval_level
        aggregates = Aggregates(config.answer_key is not None, level)
    inputs = config.materialized_inputs_jsonl_fpath
    lines = _rendered(profile.task_rows, inputs, meanwhile=lambda: profile.agent_metrics)
    write_profile(profile, paths, lines, aggregates)
    return profile, paths


_SPLIT_MIN = 2_000  # task rows below which one renderer does them all


def _rendered(rows: TaskRows, inputs: Path, meanwhile: Callable[[], object]) -> Iterator[bytes]:
    """The task rows' lines, the second half rendered meanwhile by a forked helper into a
    spool (rendering is most of writing a profile, and one core's work otherwise); this
    process calls ``meanwhile`` (the agent-level metrics, cached) after its half, while the
    helper, slower for its copy-on-write faults, still renders (a 40/60 split measured no
    better at 100,000 tasks x 8, and worse on 6 columns). Each renderer reads the ``sample``
    rows with its own file handle; the helper's error, if any, is raised here as it would
    have been in one process."""
    two = len(rows) >= _SPLIT_MIN and (os.cpu_count() or 1) > 1
    split = len(rows) // 2 if two else len(rows)
    with contextlib.ExitStack() as stack:
        spool = stack.enter_context(tempfile.TemporaryFile(prefix="rewardstream-"))
        error = stack.enter_context(tempfile.TemporaryFile(prefix="rewardstream-"))
        helper = None
        if split < len(rows):

            def the_rest() -> None:
                with InputsFile(inputs) as mine:
                    spool.writelines(task_lines(rows.range(split, len(rows)), _located(mine)))
                spool.flush()

            def failed(exc: BaseException) -> None:
                error.write(str(exc).encode())
                error.flush()

            helper = fork(the_rest, failed)
            stack.callback(_reap, helper)  # however this ends: the helper ends too
        with InputsFile(inputs) as mine:
            yield from task_lines(rows.range(0, split), _located(mine))
        if helper is None:
            return
        meanwhile()
        _, status = os.waitpid(helper, 0)
        if status:  # its error's line (a sample row that cannot be written back, say)
            error.seek(0)
            message = error.read().decode(errors="replace")
            raise InputError(message or f"the second renderer ended with status {status}")
        spool.seek(0)
        yield from iter(functools.partial(spool.read, 1 << 20), b"")


def _reap(pid: int) -> None:
    """End a helper that is still running (this process is failing or stopping) and reap it."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _located(inputs: InputsFile) -> Callable[[int], bytes]:
    """``inputs.sample``, whose error (a row nested too deeply to write back) names its line:
    lines are kept as byte offsets, so the line number is counted only on that error."""

    def sample(offset: int) -> bytes:
        try:
            return inputs.sample(offset)
        except InputError as exc:
            path = str(inputs.path)
            reason = str(exc).removeprefix(f"{path}: ")
            raise LineError(path, count_lines(path, offset) + 1, reason) from None

    return sample


def print_summary(profile: Profile, paths: ProfilePaths, aggregates: bool = False) -> None:
    print("\n".join(summary_lines(profile, paths, aggregates)))
