"""``ng_reward_profile``: profile a materialized-inputs file and a rollouts file.

The rollouts file is streamed line by line into a :class:`ProfileState`; materialized rows are
kept only as byte offsets, read back for ``sample`` at write time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from tqdm import tqdm

from processors.profile import Profile, build_profile
from processors.state import ProfileState
from rewardstream.jsonl import check_input_file, iter_jsonl
from sinks.files import InputsFile, ProfilePaths, summary_lines, write_profile

__all__ = ["ProfileConfig", "load_state", "print_summary", "run_profile"]


class ProfileConfig(BaseModel):
    """NeMo Gym's config keys for ``gym eval profile``, plus ``quiet`` for the progress bar."""

    model_config = ConfigDict(extra="forbid")

    materialized_inputs_jsonl_fpath: Path
    rollouts_jsonl_fpath: Path
    allow_partial_rollouts: bool = False
    quiet: bool = False


def _progress(path: Path, quiet: bool) -> tqdm[None]:
    return tqdm(
        total=os.path.getsize(path),
        unit="B",
        unit_scale=True,
        desc=f"profiling {path.name}",
        disable=quiet or not sys.stderr.isatty(),
        mininterval=0.5,
    )


def load_state(inputs: Path, rollouts: Path, quiet: bool = True) -> ProfileState:
    """Read both files into a fresh state (inputs first, as NeMo Gym does)."""
    check_input_file(inputs, "--inputs")
    check_input_file(rollouts, "--rollouts")
    state = ProfileState()
    for line in iter_jsonl(inputs):
        state.add_input(line.value, line.offset, f"{inputs} line {line.lineno}")
    with _progress(rollouts, quiet) as bar:
        last = 0
        for line in iter_jsonl(rollouts):
            state.add_result(line.value, f"{rollouts} line {line.lineno}")
            if line.lineno % 4096 == 0:
                bar.update(line.offset - last)
                last = line.offset
        bar.update(bar.total - last)
    return state


def run_profile(config: ProfileConfig) -> tuple[Profile, ProfilePaths]:
    """Profile, write the three files, and return what was written (for the summary)."""
    state = load_state(config.materialized_inputs_jsonl_fpath, config.rollouts_jsonl_fpath, config.quiet)
    profile = build_profile(state, config.allow_partial_rollouts)
    paths = ProfilePaths.next_to(config.rollouts_jsonl_fpath)
    with InputsFile(config.materialized_inputs_jsonl_fpath) as inputs:
        write_profile(profile, paths, inputs.sample)
    return profile, paths


def print_summary(profile: Profile, paths: ProfilePaths) -> None:
    print("\n".join(summary_lines(profile, paths)))
