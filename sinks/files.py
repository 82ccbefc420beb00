"""Write NeMo Gym's profile files atomically, reading each ``sample`` row back from its file.

Nothing is written unless everything succeeds: all three files go to temporary names in the
target folder first and are renamed into place together, so an error (or a kill) never leaves
a half-written profile, and stale files from an earlier run stay untouched until then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import orjson

from rewardstream.errors import InputError, RewardstreamError
from rewardstream.names import ProfilePaths

if TYPE_CHECKING:  # annotations only: the snapshot client writes files without numpy
    from processors.profile import Profile, TaskRow
    from processors.runs import Merged

__all__ = [
    "InputsFile",
    "ProfilePaths",
    "summary_lines",
    "task_lines",
    "write_files",
    "write_final",
    "write_profile",
]

log = logging.getLogger(__name__)

_UMASK = os.umask(0)
os.umask(_UMASK)


class InputsFile:
    """Reads materialized rows back by byte offset and renders them as ``sample`` values."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        self._fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by close()/__exit__

    def sample(self, offset: int) -> bytes:
        self._fh.seek(offset)
        row = orjson.loads(self._fh.readline())
        row.pop("_ng_task_index", None)
        row.pop("_ng_rollout_index", None)
        try:
            return orjson.dumps(row)
        except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes
            raise InputError(
                f"{self.path}: a sample row cannot be written back as JSON: {exc}"
            ) from None

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> InputsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def task_lines(rows: Iterable[TaskRow], sample: Callable[[int], bytes]) -> Iterator[bytes]:
    """The ``_reward_profiling.jsonl`` lines of ``rows``, each with its sample read back."""
    for row in rows:
        yield row.render(sample(row.sample_locator))


def write_profile(profile: Profile, paths: ProfilePaths, sample: Callable[[int], bytes]) -> None:
    """Write the three profile files; all or nothing."""
    write_files(
        [
            (paths.reward_profiling, task_lines(profile.task_rows, sample)),
            (paths.agent_metrics, [orjson.dumps(profile.agent_metrics)]),
            (paths.repeat_level_metrics, [orjson.dumps(profile.repeat_metrics)]),
        ]
    )


def write_final(
    run_id: str, merged: Merged, paths: ProfilePaths, partial: bool, expected: int | None
) -> str | None:
    """Write a run's final profile from its merged parts, as either transport finishes a run;
    the error when it cannot be profiled (e.g. rollouts without their input rows), logged."""
    from processors.profile import build_profile  # numpy: not for the light commands

    if partial:
        log.warning(
            "run %s finished incomplete (%d of %s rollouts): writing a partial profile",
            run_id,
            merged.state.num_results,
            expected if expected is not None else "?",
        )
    paths.reward_profiling.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_profile(build_profile(merged.state, partial), paths, merged.sample)
    except RewardstreamError as exc:
        log.error("run %s: no final profile: %s", run_id, exc)
        return str(exc)
    return None


def write_files(files: Sequence[tuple[Path, Iterable[bytes]]]) -> None:
    """Write several files as one: all or nothing (earlier ones are put back if one fails)."""
    for target, _ in files:
        if target.is_dir():
            raise InputError(f"Cannot write '{target}': Is a directory")
    temps: list[tuple[str, Path]] = []
    moved: list[tuple[Path, str]] = []  # (target, backup of what was there)
    placed: list[Path] = []
    try:
        for target, chunks in files:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            temps.append((tmp, target))
            os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide results from teammates
            with os.fdopen(fd, "wb") as fh:
                fh.writelines(chunks)
        for _, target in temps:
            if target.exists() or target.is_symlink():
                backup = tempfile.mktemp(prefix=f".{target.name}.old.", dir=target.parent)
                os.rename(target, backup)
                moved.append((target, backup))
        for tmp, target in temps:
            os.rename(tmp, target)
            placed.append(target)
    except OSError as exc:
        for target in placed:
            os.unlink(target)
        for target, backup in moved:
            os.rename(backup, target)
        moved.clear()
        raise InputError(
            f"Cannot write '{exc.filename or files[0][0]}': {exc.strerror or exc}"
        ) from None
    finally:
        for tmp, _ in temps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        for _, backup in moved:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(backup)


def summary_lines(profile: Profile, paths: ProfilePaths) -> list[str]:
    """The seven stdout lines NeMo Gym 0.7.0 prints after profiling (spec §2.11)."""
    s = profile.summary
    return [
        "Profiling outputs:",
        f"Reward profile completion: {s.completed_rollout_rows}/{s.expected_rollout_rows} "
        f"rollout rows ({s.reward_profile_completion_pct:.2f}%)",
        f"Input rows: {s.total_input_rows} total; {s.complete_input_rows} complete; "
        f"{s.partial_input_rows} partial; {s.missing_input_rows} without rollouts dropped "
        "from output.",
        f"Masked from quality metrics: {profile.masked_rollouts} rollout rows (kept in "
        "completion accounting above).",
        *profile_lines(paths),
    ]


def profile_lines(paths: ProfilePaths) -> list[str]:
    """NeMo Gym's three closing lines naming the profile files."""
    labels = ("Reward profiling outputs", "Agent-level metrics", "Repeat-level metrics")
    return [f"{label}: {path}" for label, path in zip(labels, paths, strict=True)]
