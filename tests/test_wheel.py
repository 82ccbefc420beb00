"""The built wheel, as a user installs it: a fresh venv outside the checkout, beside packages
named ``processors`` and ``sinks`` (``processors`` is also a PyPI name), then the console
scripts alone: ``kafka fetch`` from the shipped pom, ``kafka start``, the demo through the
broker (bundled gym servers, collector, stream processor), ``ng_reward_profile`` on what it
collected (byte for byte the live profile), ``kafka stop``.

Nothing here imports from the checkout: every command runs from the new venv's ``bin`` with
a working folder outside the repository, so a file missing from the wheel fails the test.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROFILE_FILES = ("reward_profiling.jsonl", "agent_metrics.json", "repeat_level_metrics.json")

pytestmark = pytest.mark.kafka


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    """Run a command; on failure the assertion shows its output."""
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def other_package(where: Path, name: str) -> Path:
    """A one-module distribution whose import name is ``name``."""
    src = where / f"{name}-dist"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"WHO = 'the other {name}'\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "9.9"\n'
        f'[tool.setuptools]\npackages = ["{name}"]\n'
    )
    return src


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """(bin folder, environment) of a venv holding the wheel and the two look-alike names."""
    base = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    # built from a copy: setuptools builds in the source tree, and the checkout stays clean
    source = base / "source"
    skip = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "bench", "tests")
    shutil.copytree(ROOT, source, symlinks=True, ignore=skip)
    wheel_cmd: list[str | Path] = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "-w",
        base / "dist",
    ]
    run([*wheel_cmd, source], base, env)
    (wheel,) = (base / "dist").glob("rewardstream-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert tops == {"rewardstream", wheel.name.split("-py")[0] + ".dist-info"}, tops
    venv = base / "venv"
    run([sys.executable, "-m", "venv", venv], base, env)
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    run([*pip, other_package(base, "processors"), other_package(base, "sinks")], base, env)
    run([*pip, wheel], base, env)
    yield venv / "bin", env | {"PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}


def test_the_wheel_is_one_namespace_beside_look_alike_packages(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = installed
    probe = (
        "import processors, sinks, rewardstream.processors.core.state as s;"
        "import rewardstream.sinks.files;"
        "print(processors.WHO, sinks.WHO, s.__name__, sep='|')"
    )
    out = run([bin_dir / "python", "-c", probe], tmp_path, env)
    expected = ["the other processors", "the other sinks", "rewardstream.processors.core.state"]
    assert out.strip().split("|") == expected
    for script in ("rewardstream", "ng_reward_profile", "ng_run", "ng_collect_rollouts"):
        assert run([bin_dir / script, "--version"], tmp_path, env).startswith(script)


def test_kafka_start_demo_round_trip_stop_outside_the_checkout(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = installed
    # A libs folder of its own: the jars are resolved by Maven from the pom in the wheel.
    env = env | {"KAFKA_LIBS_DIR": str(tmp_path / "libs")}
    rs = bin_dir / "rewardstream"
    run([rs, "kafka", "fetch"], tmp_path, env)
    assert any((tmp_path / "libs").glob("kafka_*.jar"))
    started = run([rs, "kafka", "start"], tmp_path, env, timeout=180)
    try:
        bootstrap = started.strip().splitlines()[-1].removeprefix("bootstrap=")
        assert (tmp_path / ".rewardstream" / "kafka" / "broker.json").is_file()
        out = tmp_path / "demo"
        demo: list[str | Path] = [
            rs,
            "demo",
            "--output-dir",
            out,
            "--bootstrap",
            bootstrap,
            "--limit",
            "20",
        ]
        run([*demo, "--topic-prefix", "wheel"], tmp_path, env)
        check = tmp_path / "check"
        check.mkdir()
        for name in ("rollouts.jsonl", "rollouts_materialized_inputs.jsonl"):
            (check / name).write_bytes((out / name).read_bytes())
        run(
            [
                bin_dir / "ng_reward_profile",
                f"+materialized_inputs_jsonl_fpath={check / 'rollouts_materialized_inputs.jsonl'}",
                f"+rollouts_jsonl_fpath={check / 'rollouts.jsonl'}",
                "+quiet=true",
            ],
            tmp_path,
            env,
        )
        for name in PROFILE_FILES:
            assert filecmp.cmp(out / f"rollouts_{name}", check / f"rollouts_{name}", shallow=False)
    finally:
        run([rs, "kafka", "stop"], tmp_path, env, timeout=120)
    status = subprocess.run(
        [rs, "kafka", "status"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert status.returncode != 0, status.stdout
