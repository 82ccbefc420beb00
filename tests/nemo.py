"""The real nemo-gym 0.7.0, for the tests that compare with it: ``NEMO_GYM_PYTHON`` is its
environment's Python (``make test`` installs one with ``.ci/nemo-reference``). Without it a test
skips, except under ``CI=true``, where it fails: CI must not pass without the reference."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["nemo_python"]


@pytest.fixture
def nemo_python() -> Path:
    found = os.environ.get("NEMO_GYM_PYTHON")
    if not found:
        reason = "NEMO_GYM_PYTHON: a Python with nemo-gym 0.7.0 (.ci/nemo-reference)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} is needed in CI", pytrace=False)
        pytest.skip(reason)
    return Path(found)
