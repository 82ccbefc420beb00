"""Write NeMo Gym's profile files atomically, reading each ``sample`` row back from its file.

Nothing is written unless everything succeeds: all three files go to temporary names in the
target folder first and are renamed into place together, so an error (or a kill) never leaves
a half-written profile, and stale files from an earlier run stay untouched until then.

Permissions are those a plain ``open()`` would give (``0o666`` less the umask, or the folder's
default ACL): each temporary file is created by ``os.open`` with mode ``0o666`` and ``O_EXCL``,
so the kernel applies the umask itself. Reading the umask would mean setting it
(``os.umask``), which is process-wide and races with every other thread creating files.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import orjson

from rewardstream.contract.names import Aggregates, ProfilePaths
from rewardstream.errors import InputError, ProfileError

if TYPE_CHECKING:  # annotations only: the snapshot client writes files without numpy
    from rewardstream.processors.core.profile import Profile, TaskRow
    from rewardstream.processors.engine.runs import Merged

__all__ = [
    "Aggregates",
    "InputsFile",
    "ProfilePaths",
    "aggregate_files",
    "check_replaceable",
    "refuse_inputs",
    "summary_lines",
    "task_lines",
    "write_files",
    "write_final",
    "write_profile",
]

log = logging.getLogger(__name__)

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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


def write_profile(
    profile: Profile,
    paths: ProfilePaths,
    sample: Callable[[int], bytes] | Iterable[bytes],
    aggregates: Aggregates | None = None,
) -> None:
    """Write the three profile files (and, when asked, the aggregate and difficulty files);
    all or nothing. ``sample`` reads a task row's ``sample`` back by its locator, or is the
    task rows' lines already rendered (by several renderers)."""
    lines = task_lines(profile.task_rows, sample) if callable(sample) else sample
    files: list[tuple[Path, Iterable[bytes]]] = [
        (paths.reward_profiling, lines),
        (paths.agent_metrics, _when_written(lambda: orjson.dumps(profile.agent_metrics))),
        (paths.repeat_level_metrics, _when_written(lambda: orjson.dumps(profile.repeat_metrics))),
    ]
    if aggregates is not None:
        files += aggregate_files(profile, paths, aggregates)
    write_files(files)


def _when_written(make: Callable[[], bytes]) -> Iterator[bytes]:
    """``make()``, computed when its file is written rather than when the files are listed,
    so the agent-level metrics (~1 s at 100,000 tasks x 8) need not hold up the task rows: the
    batch profile computes them while its forked renderer writes the second half (cached,
    they are not computed again here)."""
    yield make()


def aggregate_files(
    profile: Profile, paths: ProfilePaths, aggregates: Aggregates
) -> list[tuple[Path, Iterable[bytes]]]:
    """The aggregate metrics (two-space indent, as NeMo Gym writes them), task difficulty and
    the intervals."""
    indent = orjson.OPT_INDENT_2
    return [
        (
            paths.aggregate_metrics,
            [orjson.dumps(profile.aggregate_metrics(aggregates.answers), option=indent)],
        ),
        (paths.task_difficulty, [orjson.dumps(profile.task_difficulty(), option=indent)]),
        (paths.intervals, [orjson.dumps(profile.intervals(aggregates.level), option=indent)]),
    ]


def write_final(
    run_id: str,
    merged: Merged,
    paths: ProfilePaths,
    partial: bool,
    expected: int | None,
    aggregates: Aggregates | None = None,
) -> str | None:
    """Write a run's final profile from its merged parts, as either transport finishes a run;
    the error when it cannot be profiled (e.g. rollouts without their input rows), logged.
    A file that cannot be written (a full disk) raises :class:`InputError`: that is not the
    run's fault, and the caller decides whether to stop."""
    from rewardstream.processors.core.profile import (
        build_profile,  # numpy: not for the light commands
    )

    if partial:
        log.warning(
            "run %s finished incomplete (%d of %s rollouts): writing a partial profile",
            run_id,
            merged.state.num_results,
            expected if expected is not None else "?",
        )
    folder = paths.reward_profiling.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"Cannot write '{folder}': {exc.strerror}") from None
    try:
        write_profile(build_profile(merged.state, partial), paths, merged.sample, aggregates)
    except ProfileError as exc:
        log.error("run %s: no final profile: %s", run_id, exc)
        return str(exc)
    return None


def refuse_inputs(outputs: Iterable[Path], inputs: Mapping[Path, str]) -> None:
    """Refuse, before anything is read or written, an output that is one of the command's
    input files (the same file, by any name): writing it would destroy what it reads.
    ``inputs`` maps each input to how the user gave it (``--inputs``), for the message."""
    given: dict[tuple[int, int], str] = {}
    for path, name in inputs.items():
        with contextlib.suppress(OSError):  # a missing input is reported by its reader
            st = os.stat(path)
            given[st.st_dev, st.st_ino] = name
    for out in outputs:
        try:
            st = os.stat(out)
        except OSError:
            continue
        source = given.get((st.st_dev, st.st_ino))
        if source is not None:
            raise InputError(f"Cannot write '{out}': it is the input file given as {source}")


def write_files(files: Sequence[tuple[Path, Iterable[bytes]]]) -> None:
    """Write several files as one: all or nothing (earlier ones are put back if one fails).

    Only regular files (or nothing) are replaced: a directory, a device or a FIFO at a target
    is refused before anything is written (renaming over it would destroy it).
    """
    for target, _ in files:
        check_replaceable(target)
    temps: list[tuple[str, Path]] = []
    moved: list[tuple[Path, str]] = []  # (target, backup of what was there)
    placed: list[Path] = []
    backups: dict[Path, str] = {}  # folder -> a private folder of ours, for the backups
    try:
        for target, chunks in files:
            try:
                fd, tmp = _create_temp(target)
            except OSError as exc:  # the temporary name means nothing to the user
                raise OSError(exc.errno, exc.strerror, str(target)) from None
            temps.append((tmp, target))
            try:
                with os.fdopen(fd, "wb", buffering=1 << 20) as fh:  # few large writes
                    fh.writelines(chunks)
            except OSError as exc:  # a failed write names no file: name its target
                raise OSError(exc.errno, exc.strerror, str(target)) from None
        for _, target in temps:
            if target.exists() or target.is_symlink():
                folder = backups.get(target.parent)
                if folder is None:  # mkdtemp: a name nobody else can take (unlike mktemp)
                    folder = backups[target.parent] = tempfile.mkdtemp(
                        prefix=f".{target.name}.old.", dir=target.parent
                    )
                backup = os.path.join(folder, str(len(moved)))
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
        for folder in backups.values():
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def check_replaceable(target: Path, given: str = "") -> os.stat_result | None:
    """Refuse a target that exists and is not a regular file (a symlink is judged by what it
    points to; a dangling one is replaced); its stat, None when there is none. ``given``:
    how the user named it (`` (+output_jsonl_fpath=...)``), after the path in the error."""
    try:
        found = os.stat(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"Cannot write '{target}'{given}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(found.st_mode):
        raise InputError(f"Cannot write '{target}'{given}: Is a directory")
    if not stat.S_ISREG(found.st_mode):
        raise InputError(
            f"Cannot write '{target}'{given}: it is {_file_kind(found.st_mode)}, not a regular "
            "file; refusing to replace it"
        )
    return found


def _file_kind(mode: int) -> str:
    """What a non-regular file is, in words, for an error message."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def _create_temp(target: Path) -> tuple[int, str]:
    """A new, empty, uniquely named file next to ``target``, created as a plain ``open()``
    creates one (mode ``0o666`` less the umask, applied by the kernel); returns (fd, path)."""
    for _ in range(100):
        path = os.path.join(target.parent, f".{target.name}.{secrets.token_hex(6)}")
        try:
            return os.open(path, _CREATE, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "No usable temporary file name found", str(target))


def summary_lines(profile: Profile, paths: ProfilePaths, aggregates: bool = False) -> list[str]:
    """The seven stdout lines NeMo Gym 0.7.0 prints after profiling (docs/nemo-gym-compat.md
    §Completion summary), and two more naming the aggregate and difficulty files when they were
    written."""
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
        *profile_lines(paths, aggregates),
    ]


def profile_lines(paths: ProfilePaths, extras: bool | None = None) -> list[str]:
    """NeMo Gym's three closing lines naming the profile files, and three more naming the
    aggregate, difficulty and interval files when ``extras`` (None: when all are there)."""
    labels = ("Reward profiling outputs", "Agent-level metrics", "Repeat-level metrics")
    lines = [f"{label}: {path}" for label, path in zip(labels, paths, strict=True)]
    if extras or (extras is None and all(p.exists() for p in paths.extras())):
        lines += [f"Aggregate metrics: {paths.aggregate_metrics}"]
        lines += [f"Task difficulty: {paths.task_difficulty}"]
        lines += [f"Intervals: {paths.intervals}"]
    return lines
