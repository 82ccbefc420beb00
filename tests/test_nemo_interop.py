"""Drop-in both ways with the real nemo-gym 0.7.0 (``NEMO_GYM_PYTHON``: its environment's
Python, ``.ci/nemo-reference``): NeMo Gym's own ``ng_collect_rollouts`` against our ``ng_run``
with the bundled config, unchanged; ours against its own ``ng_run`` with its string_match
environment; its ``compute_aggregate_metrics`` against our servers' ``/aggregate_metrics``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from rewardstream.errors import InputError
from rewardstream.gym_servers.aggregate import aggregate_metrics
from rewardstream.gym_servers.datasets import prepare
from rewardstream.gym_servers.ng_run import BUNDLED_CONFIG, load_config
from rewardstream.infra.overrides import parse_overrides
from tests.gym import POLICY, NgRun, fast, ng_run, read_jsonl
from tests.nemo import nemo_ng_run, site_packages

DATA = Path(__file__).parent.parent / "gym_servers" / "data" / "arithmetic.jsonl"
OURS = Path(sys.executable)
PROFILE = ("_reward_profiling.jsonl", "_agent_metrics.json", "_repeat_level_metrics.json")


def _tool(
    python: Path, command: str, *overrides: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``command`` of the environment of ``python`` (ours, or the nemo-gym reference)."""
    return subprocess.run(
        [str(python.parent / command), *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_nemo_collector_on_our_servers(tmp_path: Path, nemo_python: Path) -> None:
    """Every rollout collected through our environment server, stamped as 0.7.0 stamps; NeMo
    Gym's profiler and ours write the same bytes from those files; our collector writes the
    same rows (but the model's random response ids and times) to the same materialized
    inputs."""
    (tmp_path / "in.jsonl").write_bytes(b"".join(DATA.read_bytes().splitlines(True)[:25]))
    run = NgRun(*fast(), f"{POLICY}.seed=7")
    try:
        head = ["+head_server.host=127.0.0.1", f"+head_server.port={run.port}"]
        common = ["+input_jsonl_fpath=in.jsonl", "+num_repeats=2", "+num_repeats_add_seed=true"]
        common += ["+responses_create_params.temperature=1.0", *head]  # seeded: reproducible
        out = "+output_jsonl_fpath"
        theirs = _tool(
            nemo_python, "ng_collect_rollouts", *common, f"{out}=n/r.jsonl", cwd=tmp_path
        )
        assert theirs.returncode == 0, theirs.stdout[-2000:] + theirs.stderr[-2000:]
        ours = _tool(OURS, "ng_collect_rollouts", *common, f"{out}=o/r.jsonl", cwd=tmp_path)
        assert ours.returncode == 0, ours.stderr[-2000:]
    finally:
        run.stop()
    nemo_rows = read_jsonl(tmp_path / "n" / "r.jsonl")
    assert len(nemo_rows) == 50
    for row in nemo_rows:
        assert row["_ng_environment_server"] == "arithmetic_environment_server"
        assert row["_ng_result_type"] == "legacy_agent"
    assert (tmp_path / "n" / "r_failures.jsonl").read_bytes() == b""

    _same_collections(tmp_path / "n", tmp_path / "o")
    _same_profiles(tmp_path, tmp_path / "n", nemo_python)


def test_our_collector_on_nemo_servers(tmp_path: Path, nemo_python: Path) -> None:
    """Our ``ng_collect_rollouts`` against NeMo Gym 0.7.0's own ``ng_run`` with its string_match
    environment (its model server proxying to our simulated policy): the agent found by its
    instance name through NeMo's head server, every rollout through NeMo's environment server,
    and the same files as NeMo's own collector writes against the same servers."""
    data = tmp_path / "in.jsonl"  # NeMo's example rows, and ours that our policy solves
    example = site_packages(nemo_python) / "resources_servers/string_match/data/example.jsonl"
    ours = [
        orjson.dumps(
            {**{k: v for k, v in row.items() if k != "agent_ref"}, "extraction_mode": "boxed"}
        )
        + b"\n"
        for row in read_jsonl(DATA)[:10]
    ]
    data.write_bytes(example.read_bytes() + b"".join(ours))
    with ng_run(*fast(), f"{POLICY}.seed=7") as policy:
        model = f"+policy_base_url={policy.url('policy_model')}/v1"
        with nemo_ng_run(
            nemo_python, tmp_path, model, "+policy_api_key=dummy", "+policy_model_name=simulated"
        ) as port:
            common = [f"+input_jsonl_fpath={data}", "+agent_name=string_match_simple_agent"]
            common += ["+num_repeats=3", "+num_repeats_add_seed=true", f"+head_server.port={port}"]
            common += ["+head_server.host=127.0.0.1", "+responses_create_params.temperature=1.0"]
            out = "+output_jsonl_fpath"
            mine = _tool(OURS, "ng_collect_rollouts", *common, f"{out}=o/r.jsonl", cwd=tmp_path)
            assert mine.returncode == 0, mine.stderr[-2000:]
            theirs = _tool(
                nemo_python, "ng_collect_rollouts", *common, f"{out}=n/r.jsonl", cwd=tmp_path
            )
            assert theirs.returncode == 0, theirs.stdout[-2000:] + theirs.stderr[-2000:]
    rows = read_jsonl(tmp_path / "o" / "r.jsonl")
    assert len(rows) == 45
    assert {0.0, 1.0} <= {row["reward"] for row in rows}  # and 0.98, a close number
    for row in rows:
        assert row["_ng_environment_server"] == "string_match_environment_server"
        assert row["_ng_result_type"] == "legacy_agent"
    _same_collections(tmp_path / "n", tmp_path / "o")
    _same_profiles(tmp_path, tmp_path / "o", nemo_python)


def _same_collections(nemo: Path, ours: Path) -> None:
    """Two collectors' files from the same servers: the same materialized inputs and failures,
    the same rows but the model's random ids and times, the same aggregate metrics' shape."""
    for name in ("r_materialized_inputs.jsonl", "r_failures.jsonl"):
        assert (nemo / name).read_bytes() == (ours / name).read_bytes(), name

    def keyed(rows: list[dict[str, object]]) -> dict[object, bytes]:
        out: dict[object, bytes] = {}
        for row in rows:
            response = row["response"]
            assert isinstance(response, dict)
            response.pop("id"), response.pop("created_at")
            for item in response.get("output") or []:
                item.pop("id", None)
            out[(row["_ng_task_index"], row["_ng_rollout_index"])] = orjson.dumps(row)
        return out

    assert keyed(read_jsonl(nemo / "r.jsonl")) == keyed(read_jsonl(ours / "r.jsonl"))
    aggregates = [
        orjson.loads((side / "r_aggregate_metrics.json").read_bytes()) for side in (nemo, ours)
    ]
    assert [list(e) for e in aggregates[0]] == [list(e) for e in aggregates[1]]


def _same_profiles(tmp_path: Path, collected: Path, nemo_python: Path) -> None:
    """Both profilers on one collection's files: byte for byte."""
    for side, python in (("pn", nemo_python), ("po", OURS)):
        folder = tmp_path / side
        folder.mkdir()
        for name in ("r.jsonl", "r_materialized_inputs.jsonl"):
            (folder / name).write_bytes((collected / name).read_bytes())
        done = _tool(
            python,
            "ng_reward_profile",
            f"+materialized_inputs_jsonl_fpath={folder}/r_materialized_inputs.jsonl",
            f"+rollouts_jsonl_fpath={folder}/r.jsonl",
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    for suffix in PROFILE:
        assert (tmp_path / "pn" / f"r{suffix}").read_bytes() == (
            tmp_path / "po" / f"r{suffix}"
        ).read_bytes(), suffix


_AGGREGATE = """
import json, sys
from nemo_gym.reward_profile import compute_aggregate_metrics
for rows in json.load(open(sys.argv[1])):
    print(json.dumps(compute_aggregate_metrics(rows).model_dump(mode="json")))
"""


def test_aggregate_metrics_equal_0_7_0s(tmp_path: Path, nemo_python: Path) -> None:
    """Our servers' ``/aggregate_metrics`` against 0.7.0's ``compute_aggregate_metrics``: the
    same JSON, keys in the same order, for a measured, a partly and a fully masked run, with
    and without ``ng_perf`` records (``perf_summary``: int and float fields, some missing)."""

    def perf(i: int, ints: bool) -> dict[str, Any]:
        record: dict[str, Any] = {"num_turns": i % 3 + (0 if i % 5 else 1)}
        record["token_observability_coverage"] = [0.0, 0.5, 1][i % 3]
        record["total_latency_ms"] = 40 * i + 3 if ints else 12.5 * i + 0.1 * (i % 7)
        if i % 4:
            record["completion_tokens"] = 100 + 37 * i
            record["prompt_tokens"] = 1000 + 3 * i if ints else 1000.5 + i / 3
        if i % 6 == 1:
            record["cached_prompt_tokens"] = i
        return record

    def rows(masked: set[int], perfs: str = "") -> list[dict[str, Any]]:
        out = [
            {
                "_ng_task_index": t,
                "_ng_rollout_index": r,
                "reward": float((t * 7 + r * 3) % 4) / 3,
                "mask_sample": 2 * t + r in masked,
                "agent_ref": {"name": "a"},
                "response": {"usage": {"output_tokens": 10 + t + r}},
            }
            for t in range(4)
            for r in range(3)
        ]
        for i, row in enumerate(out):
            if perfs and i % 5 != 2:  # some rollouts carry none
                row["ng_perf"] = perf(i, perfs == "ints")
        return out

    cases = [rows(set()), rows({0, 5, 6}), rows(set(range(12)))]
    cases += [rows(set(), "ints"), rows({0, 5, 6}, "floats"), rows(set(range(12)), "floats")]
    path = tmp_path / "cases.json"
    path.write_bytes(orjson.dumps(cases))
    proc = subprocess.run(
        [str(nemo_python), "-c", _AGGREGATE, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    for case, line in zip(cases, proc.stdout.splitlines(), strict=True):
        theirs, ours = orjson.loads(line), aggregate_metrics(case)
        assert orjson.dumps(theirs) == orjson.dumps(ours)


def test_nemo_aggregate_equals_ours(tmp_path: Path, nemo_python: Path) -> None:
    """0.7.0's ``ng_aggregate_rollouts`` (through our servers) and ours (without them) on the
    same shards: the same merged rollouts, byte for byte, and the same metrics; and with failed
    and lost rollouts counted as zeros (each shard with its own failures sidecar and
    materialized inputs): the same metrics and the same coverage report."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(DATA.read_bytes().splitlines(True)[:15]))
    zeros = ["+count_failure_classes_as_zero=[agent_run_error]"]
    zeros += ["+count_missing_rollouts_as_zero=true"]
    run = NgRun(*fast())
    try:
        head = ["+head_server.host=127.0.0.1", f"+head_server.port={run.port}"]
        collect = ["+input_jsonl_fpath=in.jsonl", "+num_repeats=4", *head]
        done = _tool(
            OURS, "ng_collect_rollouts", *collect, "+output_jsonl_fpath=c/r.jsonl", cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr[-2000:]
        lines = (tmp_path / "c" / "r.jsonl").read_bytes().splitlines(True)
        for i in range(3):
            (tmp_path / f"s{i}.jsonl").write_bytes(b"".join(lines[i::3]))
        _lossy_shards(tmp_path / "c", tmp_path / "z")
        sides: dict[str, subprocess.CompletedProcess[str]] = {}
        for side, python in (("n", nemo_python), ("o", OURS)):
            for glob, out, extra in (("s*", side, []), ("z/s*", f"z{side}", zeros)):
                sides[out] = _tool(
                    python,
                    "ng_aggregate_rollouts",
                    f"+input_glob={glob}.jsonl",
                    f"+output_jsonl_fpath={out}/r.jsonl",
                    *extra,
                    *(head if python == nemo_python else []),  # ours needs no servers
                    *(["+disable_health_check=true"] if python == nemo_python else []),
                    cwd=tmp_path,
                )
                assert sides[out].returncode == 0, sides[out].stdout[-2000:] + sides[out].stderr
    finally:
        run.stop()
    assert (tmp_path / "n" / "r.jsonl").read_bytes() == (tmp_path / "o" / "r.jsonl").read_bytes()
    for n, o in (("n", "o"), ("zn", "zo")):
        metrics = [(tmp_path / side / "r_aggregate_metrics.json").read_bytes() for side in (n, o)]
        assert metrics[0] == metrics[1]
    report = ("Counting ", "Rollouts missing", "Metrics cover", "Scored as zero")
    said = [[x for x in sides[s].stdout.splitlines() if x.startswith(report)] for s in ("zn", "zo")]
    assert len(said[0]) == 5 and said[0] == said[1]


def _lossy_shards(collected: Path, folder: Path) -> None:
    """Shards by task (task % 3), each with its materialized inputs and a failures sidecar:
    some rollouts failed (the counted class, another class, one that later landed), some lost."""
    folder.mkdir()
    rows = read_jsonl(collected / "r.jsonl")
    inputs = read_jsonl(collected / "r_materialized_inputs.jsonl")
    for shard in range(3):
        mine = [r for r in rows if r["_ng_task_index"] % 3 == shard]
        landed, failures = [], []
        for i, row in enumerate(
            sorted(mine, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
        ):
            failure = {k: v for k, v in row.items() if k not in ("response", "reward")}
            failure |= {"_ng_failure_class": "agent_run_error", "_ng_failure_http_status": 500}
            if i % 7 == 1:  # failed for good, in the counted class
                failures.append(failure)
            elif i % 7 == 3:  # failed in another class: left out, reported
                failures.append(failure | {"_ng_failure_class": "agent_request_failed"})
            elif i % 7 == 5:  # lost: no row, no failure
                pass
            else:
                if i % 5 == 0:  # an earlier attempt failed, then it landed
                    failures.append(failure)
                landed.append(row)
        shard_inputs = [r for r in inputs if r["_ng_task_index"] % 3 == shard]
        for name, part in (
            ("", landed),
            ("_failures", failures),
            ("_materialized_inputs", shard_inputs),
        ):
            (folder / f"s{shard}{name}.jsonl").write_bytes(
                b"".join(orjson.dumps(r) + b"\n" for r in part)
            )


def test_prompt_config_materializes_as_0_7_0(tmp_path: Path, nemo_python: Path) -> None:
    """``+prompt_config`` (a {user, system} template over the rows' fields): our materialized
    inputs equal 0.7.0's byte for byte, and rows that already have an input are refused."""
    rows = []
    for line in DATA.read_bytes().splitlines()[:8]:
        row = orjson.loads(line)
        messages = row["responses_create_params"]["input"]
        rest = {k: v for k, v in row["responses_create_params"].items() if k != "input"}
        rows.append({"question": messages[-1]["content"], **row, "responses_create_params": rest})
    (tmp_path / "raw.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (tmp_path / "prompt.yaml").write_text(
        "system: 'Solve it. Put the answer in \\\\boxed{{}}.'\nuser: '{question}'\n"
    )
    run = NgRun(*fast())
    try:
        head = ["+head_server.host=127.0.0.1", f"+head_server.port={run.port}"]
        collect = ["ng_collect_rollouts", "+input_jsonl_fpath=raw.jsonl", "+num_repeats=2"]
        collect += ["+prompt_config=prompt.yaml", *head]
        for python, side in ((nemo_python, "n"), (OURS, "o")):
            done = _tool(python, *collect, f"+output_jsonl_fpath={side}/r.jsonl", cwd=tmp_path)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            assert "Using prompt config: prompt.yaml" in done.stdout
        name = "r_materialized_inputs.jsonl"
        assert (tmp_path / "n" / name).read_bytes() == (tmp_path / "o" / name).read_bytes()
        assert len(read_jsonl(tmp_path / "o" / "r.jsonl")) == 16
        (tmp_path / "bad.jsonl").write_bytes(DATA.read_bytes().splitlines(True)[0])
        bad = _tool(
            OURS,
            *collect[:1],
            "+input_jsonl_fpath=bad.jsonl",
            *collect[3:],
            "+output_jsonl_fpath=b/r.jsonl",
            cwd=tmp_path,
        )
    finally:
        run.stop()
    assert bad.returncode == 2 and "Violating rows: [0]" in bad.stderr
    assert not (tmp_path / "b").exists()


def test_a_prepared_split_as_0_7_0(tmp_path: Path, nemo_python: Path) -> None:
    """A split of the datasets a config declares (what ``ng_e2e_collect_rollouts`` runs):
    collated as 0.7.0's data preparation collates it, byte for byte, and its rows (which name
    only a ``task_source``) materialized with the agent 0.7.0's collector resolves them to."""
    lines = DATA.read_bytes().splitlines(True)
    data, more = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    data.write_bytes(b"".join(lines[:5]))
    more.write_bytes(b"".join(lines[5:9]))
    config = orjson.loads(orjson.dumps(yaml.safe_load(BUNDLED_CONFIG.read_text())))
    agent = config["arithmetic_simple_agent"]["responses_api_agents"]["simple_agent"]
    license = {"license": "Apache 2.0"}
    agent["datasets"] = [{"name": "a", "type": "train", "jsonl_fpath": str(data), **license}]
    resources = config["arithmetic_resources_server"]["resources_servers"]["arithmetic"]
    resources["datasets"] = [{"name": "b", "type": "train", "jsonl_fpath": str(more), **license}]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    prepared = _tool(
        nemo_python,
        "ng_prepare_data",
        f"+config_paths=[{tmp_path / 'c.yaml'}]",
        f"+output_dirpath={tmp_path / 'n'}",
        "+mode=train_preparation",
        cwd=tmp_path,
    )
    assert prepared.returncode == 0, prepared.stdout[-2000:] + prepared.stderr[-2000:]
    ours = prepare(load_config([f"+config_paths=[{tmp_path / 'c.yaml'}]"]), "train", tmp_path / "o")
    assert ours.read_bytes() == (tmp_path / "n" / "train.jsonl").read_bytes()
    assert {r["task_source"] for r in read_jsonl(ours)} == set(config) & {
        "arithmetic_simple_agent",
        "arithmetic_resources_server",
    }
    with ng_run(*fast(), f"{POLICY}.seed=7") as run:
        collect = [f"+input_jsonl_fpath={ours}", "+head_server.host=127.0.0.1"]
        collect += [f"+head_server.port={run.port}", "+num_repeats=2"]
        collect += ["+num_repeats_add_seed=true", "+responses_create_params.temperature=1.0"]
        for python, side in ((nemo_python, "cn"), (OURS, "co")):
            done = _tool(
                python,
                "ng_collect_rollouts",
                *collect,
                f"+output_jsonl_fpath={side}/r.jsonl",
                cwd=tmp_path,
            )
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    name = "r_materialized_inputs.jsonl"
    assert (tmp_path / "cn" / name).read_bytes() == (tmp_path / "co" / name).read_bytes()
    assert {r["agent_ref"]["name"] for r in read_jsonl(tmp_path / "co" / name)} == {
        "arithmetic_simple_agent"
    }
    _same_collections(tmp_path / "cn", tmp_path / "co")


_PARSE = """
import json, sys
from omegaconf import OmegaConf
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
cli = OmegaConf.create(json.loads(sys.argv[1]))
parsed = GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(
    initial_global_config_dict=cli, skip_load_from_cli=True,
    offline=True))
print(json.dumps(OmegaConf.to_container(parsed, resolve=True)))
"""


def test_config_merging_as_0_7_0(
    tmp_path: Path, nemo_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ng_run``'s configs, ``env.yaml`` and command line merged as 0.7.0 merges them (it is
    OmegaConf in both): precedence, mappings merged, lists replaced, ``${...}`` inside strings,
    resolvers."""
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "host: config-host\nport: 1\nendpoint: http://${host}:${port}/v1\nlisty: [1, 2, 3]\n"
        "nested: {a: 1, b: {c: 2}}\nhome: ${oc.env:HOME}\n"
        "policy_model: {responses_api_models: {simulated_model: {max_tokens: 5}}}\n"
    )
    (tmp_path / "env.yaml").write_text("host: env-host\nlisty: [9]\nnested: {b: {d: 4}}\n")
    cli = {"config_paths": [str(BUNDLED_CONFIG), str(extra)], "port": 7, "nested": {"a": 5}}
    monkeypatch.chdir(tmp_path)
    ours = load_config([f"+config_paths=[{BUNDLED_CONFIG},{extra}]", "+port=7", "+nested.a=5"])
    proc = subprocess.run(
        [str(nemo_python), "-c", _PARSE, orjson.dumps(cli).decode()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = orjson.loads(proc.stdout.splitlines()[-1])
    for key in ("host", "port", "endpoint", "listy", "nested", "home"):
        assert ours[key] == theirs[key], key
    assert ours["endpoint"] == "http://env-host:7/v1" and ours["listy"] == [9]
    model = ("policy_model", "responses_api_models", "simulated_model")
    mine, nemo = ours, theirs
    for part in model:
        mine, nemo = mine[part], nemo[part]
    for key in ("max_tokens", "openai_model", "simulated_policy", "entrypoint"):
        assert mine[key] == nemo[key], key


_HYDRA = """
import json, sys
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Sweep
parser = OverridesParser.create()
out = []
for token in json.loads(sys.argv[1]):
    try:
        (override,) = parser.parse_overrides([token])
        value = override.value()
        out.append(["error"] if isinstance(value, Sweep) else [override.key_or_group, value])
    except Exception:
        out.append(["error"])
print(json.dumps(out))
"""

_VALUES = [
    *("+a=1", "+b=-1.5", "+c=true", "+d=NULL", "+e=hello", "+f=[1, 2, x]", "+g={k: 1, m: [a]}"),
    *("+h='a, b'", '+i="q"', "++j=2", "+k.l.m=3", "+n=1e3", "+o=", "+p=${a}", "+q=http://x:1/v"),
    *("+r=[]", "+s=[[1], {a: b}]", "+t=TRUE", "+u=0x10", "+v=a,b", "+w=[a,b],c", "+x=~"),
]


def test_override_values_as_hydra_reads_them(nemo_python: Path) -> None:
    """Every command's ``+key=value`` values typed as Hydra (which NeMo Gym's commands parse
    them with) types them, an unquoted top-level comma (a sweep there) refused as there."""
    proc = subprocess.run(
        [str(nemo_python), "-c", _HYDRA, orjson.dumps(_VALUES).decode()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    theirs = orjson.loads(proc.stdout)
    ours: list[list[Any]] = []
    for token in _VALUES:
        try:
            parsed = parse_overrides([token])
        except InputError:
            ours.append(["error"])
            continue
        key = token.lstrip("+").partition("=")[0]
        value: Any = parsed
        for part in key.split("."):
            value = value[part]
        ours.append([key, value])
    assert ours == theirs
