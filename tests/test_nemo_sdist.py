"""NeMo Gym 0.7.0's own unit tests of its profiler and of ``/aggregate_metrics``
(``test_reward_profile.py``, ``test_aggregate_metrics.py`` from its sdist, fetched by
``.ci/nemo-reference``), unchanged, against our ``ng_reward_profile`` and our servers'
``/aggregate_metrics``: ``tests/nemo_sdist_conftest.py`` routes what they call to ours."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.gym import fast, ng_run

SDIST = Path(os.environ.get("NEMO_GYM_SDIST", Path(__file__).parent.parent / ".nemo-gym/sdist"))
FILES = ("test_reward_profile.py", "test_aggregate_metrics.py")
ROUTED = {"test_reward_profile.py": 21, "test_aggregate_metrics.py": 42}
"""Tests that call ours and pass, per file; the rest test NeMo's in-process helpers (each
skip names why), so a routing change that skips more fails here."""


def _tree(root: Path) -> Path:
    """The sdist's test folder as NeMo lays it out, with our conftest beside the tests."""
    unit = root / "tests" / "unit_tests"
    unit.mkdir(parents=True)
    for package in (root / "tests", unit):
        (package / "__init__.py").touch()
    shutil.copy(SDIST / "tests" / "conftest.py", root / "tests" / "conftest.py")
    for name in FILES:
        shutil.copy(SDIST / "tests" / "unit_tests" / name, unit / name)
    shutil.copy(Path(__file__).parent / "nemo_sdist_conftest.py", unit / "conftest.py")
    (root / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    return root


def test_nemo_gym_0_7_0s_own_unit_tests_pass_against_ours(
    tmp_path: Path, nemo_python: Path
) -> None:
    assert (SDIST / "tests" / "unit_tests" / FILES[0]).exists(), f"{SDIST}: .ci/nemo-reference"
    root = _tree(tmp_path / "nemo")
    junit = tmp_path / "junit.xml"
    with ng_run(*fast()) as run:
        env = os.environ | {
            "REWARDSTREAM_PROFILE_CMD": str(Path(sys.executable).parent / "ng_reward_profile"),
            "REWARDSTREAM_AGGREGATE_URL": run.url("arithmetic_resources_server")
            + "/aggregate_metrics",
        }
        cmd = [str(nemo_python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"]
        proc = subprocess.run(
            [*cmd, f"--junitxml={junit}", "tests/unit_tests"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    outcomes: dict[str, dict[str, int]] = {name: {} for name in FILES}
    for case in ET.parse(junit).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = kinds[0] if kinds else "passed"
        if outcome == "skipped":
            message = case.find("skipped").get("message", "")  # type: ignore[union-attr]
            assert "not adaptable: " in message, f"{case.get('name')} skipped: {message}"
        module = case.get("classname", "").split(".")[2] + ".py"
        outcomes[module][outcome] = outcomes[module].get(outcome, 0) + 1
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert {name: counts.get("passed") for name, counts in outcomes.items()} == ROUTED
