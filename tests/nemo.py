"""The real nemo-gym 0.7.0, for the tests that compare with it: ``NEMO_GYM_PYTHON`` is its
environment's Python (``make test`` installs one with ``.ci/nemo-reference``). Without it a test
skips, except under ``CI=true``, where it fails: CI must not pass without the reference."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rewardstream.kafka.local import free_port

__all__ = ["STRING_MATCH", "nemo_ng_run", "nemo_python", "site_packages"]


@pytest.fixture
def nemo_python() -> Path:
    found = os.environ.get("NEMO_GYM_PYTHON")
    if not found:
        reason = "NEMO_GYM_PYTHON: a Python with nemo-gym 0.7.0 (.ci/nemo-reference)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} is needed in CI", pytrace=False)
        pytest.skip(reason)
    return Path(found)


STRING_MATCH = (
    "resources_servers/string_match/configs/string_match.yaml",
    "responses_api_models/openai_model/configs/openai_model.yaml",
)
"""NeMo Gym's own string_match environment (its resources server, ``simple_agent`` and
``legacy_agent`` environment server) and its OpenAI model server, as its wheel ships them."""


def site_packages(nemo_python: Path) -> Path:
    """Where the reference's packages (and the servers its wheel ships) are installed."""
    (found,) = (nemo_python.parent.parent / "lib").glob("python3*/site-packages")
    return found


@contextlib.contextmanager
def nemo_ng_run(nemo_python: Path, folder: Path, *overrides: str) -> Iterator[int]:
    """NeMo Gym 0.7.0's own ``ng_run`` with :data:`STRING_MATCH` (plus ``overrides``), running
    in ``folder`` until the context ends; yields its head server's port.

    Each server would get a venv of its own from ``uv`` (and a Python >= 3.13.14 from GitHub,
    out of reach here): with ``skip_venv_if_present`` each one's venv is a link to the
    reference's. Ray starts a local cluster (~10 s) in a folder of its own, which the run's
    SIGINT shuts down; whatever is left of its process group is killed after.
    """
    venvs = folder / "venvs"
    for server in {str(Path(config).parent.parent) for config in STRING_MATCH} | {
        "responses_api_agents/simple_agent",
        "environment_servers/legacy_agent",
    }:
        (venvs / server).mkdir(parents=True)
        (venvs / server / ".venv").symlink_to(nemo_python.parent.parent)
    ray = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # sockets: keep the path short
    env = os.environ | {
        "RAY_TMPDIR": str(ray),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_prestart_worker_first_driver": "0",
        "RAY_AUTH_MODE": "disabled",
    }
    port = free_port()
    cmd = [str(nemo_python.parent / "ng_run"), f"+config_paths=[{','.join(STRING_MATCH)}]"]
    cmd += [f"+head_server.port={port}", f"+uv_venv_dir={venvs}", "+skip_venv_if_present=true"]
    log = (folder / "ng_run.log").open("wb")
    proc = subprocess.Popen(
        [*cmd, *overrides],
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not _ready(f"http://127.0.0.1:{port}/readyz"):
            tail = (folder / "ng_run.log").read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"NeMo Gym's ng_run exited: {tail}"
            assert time.monotonic() < deadline, f"NeMo Gym's ng_run not ready: {tail}"
            time.sleep(0.5)
        yield port
    finally:
        proc.send_signal(signal.SIGINT)  # its own shutdown: servers, head, Ray
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        shutil.rmtree(ray, ignore_errors=True)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:  # refused, or 503 (HTTPError) while it starts
        return False
