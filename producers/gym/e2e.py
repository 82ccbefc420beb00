r"""``ng_e2e_collect_rollouts`` (NeMo Gym 0.7.0's ``gym eval run`` without ``--no-serve``):
prepare a split of the datasets a config declares, start its servers, collect, stop them.

    ng_e2e_collect_rollouts "+config_paths=[gym_servers/configs/arithmetic.yaml]" \
        +split=train +output_jsonl_fpath=out/r.jsonl [+reuse_existing_data_preparation=true] \
        [+num_repeats=N] [+limit=L] [any ng_run or ng_collect_rollouts override]

As 0.7.0: ``split`` is train, validation or benchmark (``example`` is refused with the recipe
for it, as is ``input_jsonl_fpath``: the input is always the prepared split); the split's
datasets are collated into ``out/r/preprocessed_datasets/<split>.jsonl``
(:mod:`rewardstream.gym_servers.datasets`; kept and reused with
``+reuse_existing_data_preparation=true``); then the config's servers start (as ``ng_run``)
and the collection runs on that file (as ``ng_collect_rollouts``, its rows' agents resolved
from their ``task_source``); the servers stop however it ends. Unlike 0.7.0 it does not
download missing datasets, nor write dataset metrics (``<split>_metrics.json``) or the
``*_prepare.jsonl`` copies beside the source datasets.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rewardstream.errors import InputError
from rewardstream.gym_servers.datasets import SPLITS, check_split, prepare
from rewardstream.gym_servers.ng_run import ServerGroup, merged_config
from rewardstream.infra.command import override_command, run_loop
from rewardstream.infra.overrides import parse_overrides
from rewardstream.producers.gym.collect import (
    CollectConfig,
    CollectReport,
    Servers,
    collect,
    print_closing,
    validated,
)

__all__ = ["main", "run_e2e"]

_E2E_KEYS = ("split", "reuse_existing_data_preparation")
_NO_INPUT = (
    "`input_jsonl_fpath` (-i/--input) is not supported when serving end-to-end: the input is "
    "always the prepared dataset for the requested split. Either add --no-serve to collect "
    "rollouts from your own input file against already-running servers, or drop -i/--input "
    "to use the prepared data."
)
_NO_EXAMPLE = (
    "`--split example` is not runnable end-to-end: example datasets are committed "
    "smoke-test samples, not prepared train/validation/benchmark splits. To run one, start the "
    "servers and point at the example file directly:\n"
    "  gym env start --resources-server <server> ...\n"
    "  gym eval run --no-serve --agent <agent> --input <server_dir>/data/example.jsonl "
    "--output <out>.jsonl"
)


def _split(overrides: dict[str, Any]) -> tuple[str, bool]:
    """The split and whether to reuse its preparation, checked as 0.7.0 checks them."""
    if "input_jsonl_fpath" in overrides:
        raise InputError(_NO_INPUT)
    split = overrides.get("split")
    if split == "example":
        raise InputError(_NO_EXAMPLE)
    if split not in SPLITS:
        raise InputError(
            f"invalid configuration 'split': Input should be 'train', 'validation' or "
            f"'benchmark' (got {split!r})"
        )
    reuse = overrides.get("reuse_existing_data_preparation", False)
    if not isinstance(reuse, bool):
        raise InputError(
            f"invalid configuration 'reuse_existing_data_preparation': expected true or false, "
            f"got {reuse!r}"
        )
    return split, reuse


def run_e2e(overrides: dict[str, Any]) -> CollectReport:
    """Prepare, serve, collect (blocking); prints 0.7.0's lines."""
    split, reuse = _split(overrides)
    collecting_keys = set(CollectConfig.model_fields) - {*Servers.model_fields, "config_paths"}
    collecting = {k: v for k, v in overrides.items() if k in collecting_keys}
    serving = {k: v for k, v in overrides.items() if k not in collecting_keys | set(_E2E_KEYS)}
    if "output_jsonl_fpath" not in collecting:
        raise InputError("missing required configuration: +output_jsonl_fpath=<value>")
    output = Path(str(collecting["output_jsonl_fpath"]))
    folder = output.with_suffix("") / "preprocessed_datasets"
    prepared = folder / f"{split}.jsonl"
    config = merged_config(serving)
    check_split(split, config)
    cfg = validated(CollectConfig, collecting | {"input_jsonl_fpath": prepared})  # before serving
    if reuse and prepared.exists():
        print(
            "Skipping data preparation since `reuse_existing_data_preparation=true` and the "
            f"final input jsonl fpath `{prepared}` already exists"
        )
    else:
        if reuse:
            print(
                "Even though the `reuse_existing_data_preparation=true` flag was set, we will "
                f"still do data preparation since the final input jsonl fpath `{prepared}` does "
                "not exist yet"
            )
        prepare(config, split, folder)
    print(
        f"Output artifacts:\n1. Preprocessed datasets: {folder}\n"
        f"2. Dataset file used for rollout collection: {prepared}\n"
        f"3. Rollout collection results file: {output}\n"
    )

    async def serve_and_collect() -> CollectReport:
        async with ServerGroup(config) as servers:
            return await collect(cfg.model_copy(update={"head_server_url": servers.head_url}))

    report = run_loop(serve_and_collect())
    print_closing(report)
    return report


def _usage() -> str:
    return __doc__ or ""


def main(argv: Sequence[str] | None = None) -> int:
    def go(args: list[str]) -> int:
        run_e2e(parse_overrides(args))
        return 0

    return override_command("ng_e2e_collect_rollouts", _usage, argv, go)


if __name__ == "__main__":
    sys.exit(main())
