"""The monitoring files under deploy/ are valid and do what they say: Prometheus's own
``promtool`` checks the scrape config and the rules, and runs the rules' unit tests (each
recording rule and alert, deploy/prometheus/rules.test.yml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian's prometheus package, .ci/system-deps)"
)


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "rules.yml"],
        ["test", "rules", "rules.test.yml"],
    ],
    ids=lambda a: " ".join(a),
)
def test_promtool(argv: list[str]) -> None:
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, *argv], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
