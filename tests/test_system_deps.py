"""``make test`` changes nothing on the host beyond files: no Debian package that
``.ci/system-deps`` installs ships a system service (installing one enables and starts it).

Each package named in the script's ``missing+=(...)`` lines is checked by its installed file
list (``dpkg -L``); one not installed here cannot be checked and is skipped by name."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "system-deps"
SERVICE = re.compile(r"^(/usr)?/lib/systemd/system/.+\.(service|socket|timer)$|^/etc/init\.d/.+")


def installed_packages(script: str) -> list[str]:
    """The packages the script may ``apt-get install``."""
    return re.findall(r"missing\+=\(([\w.+-]+)\)", script)


def services(package: str) -> list[str] | None:
    """The unit files and init scripts ``package`` installed (None: not installed here)."""
    listed = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        return None
    return [line for line in listed.stdout.splitlines() if SERVICE.match(line)]


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="Debian's dpkg")
def test_no_package_the_install_adds_starts_a_service() -> None:
    packages = installed_packages(SCRIPT.read_text())
    assert "maven" in packages and "tmux" in packages  # the parse reads the script
    found = {p: s for p in packages if (s := services(p))}
    assert not found, f"these would enable and start a system service: {found}"


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="Debian's dpkg")
def test_the_check_sees_a_package_with_a_service() -> None:
    """The check can fail: a script naming a package that ships a unit has it reported. apt,
    on every Debian, ships apt-daily.service; ``prometheus`` (whose package ships
    prometheus.service) is parsed as the old script named it."""
    assert installed_packages("command -v prometheus || missing+=(prometheus)\n") == ["prometheus"]
    packages = installed_packages("command -v apt-get || missing+=(apt)\n")
    found = {p: s for p in packages if (s := services(p))}
    assert any(unit.endswith("/systemd/system/apt-daily.service") for unit in found["apt"])
