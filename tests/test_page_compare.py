"""The page's compare view (``/?compare=A,B``) in Debian's headless Chromium against a real
processor's HTTP face on loopback (``make_app`` over a ``Pipeline`` fed in process): at
1400x1000, 1024x768 and 390x844 it shows, per agent, both runs' means and bands and the
difference's interval and verdict exactly as ``GET /compare/A/B`` gives them, the rule in words,
its plots inside their tracks and nothing wider than the screen; an unknown run is said so;
ticking two runs in the runs table leads to their comparison.

``REWARDSTREAM_SCREENSHOTS=docs`` saves ``docs/page-compare.png`` (1400x1000).
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from selenium import webdriver

from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.server import make_app
from rewardstream.producers.events import input_events, rollout_events
from tests.processes import serving
from tests.test_live_compare import REPEATS
from tests.test_live_compare import _collection as collection
from tests.test_page_axes import DOCS, SIZES, browser

__all__ = ["browser"]  # the fixture, used by name

# per run, each agent's share of rollouts rewarded 1: math better, code worse, judge the same
RATES = {
    "baseline": {"math": 0.3, "code": 0.65, "judge": 0.5},
    "candidate": {"math": 0.8, "code": 0.2, "judge": 0.5},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a processor holding the runs of :data:`RATES`, open."""
    data = tmp_path_factory.mktemp("runs")
    pipeline = Pipeline(data / "state")
    for run_id, rates in RATES.items():
        reward = lambda a, t, r, rates=rates: float((t * REPEATS + r) % 20 < rates[a] * 20)  # noqa: E731
        inputs, rollouts = collection(data / run_id, reward, list(rates))
        for event in [*input_events(inputs, run_id), *rollout_events(rollouts, run_id)]:
            pipeline.handle(event.kind, event.value)
    try:
        with serving(make_app(pipeline, None)) as url:
            yield url
    finally:
        pipeline.close()


SHOWN = """
  const section = document.querySelector('#compare');
  const rows = [...document.querySelectorAll('#compare-agents tbody tr')].map((tr) =>
    Object.fromEntries([...tr.cells].map((c) => [c.dataset.field,
      {value: c.dataset.value ?? null, upper: c.dataset.upper ?? null, text: c.textContent}])));
  const inside = [...document.querySelectorAll('.track')].every((t) => {
    const box = t.getBoundingClientRect();
    return [...t.children].every((m) => { const r = m.getBoundingClientRect();
      return r.left >= box.left - 5 && r.right <= box.right + 5; });
  });
  const wide = [...document.querySelectorAll('body *')].filter((e) => !e.closest('.scroll'))
    .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
    .map((e) => e.tagName + '.' + e.className);
  return {hidden: section.hidden, rows, inside, wide,
          plots: document.querySelectorAll('#compare-plots .pair').length,
          rule: document.querySelector('#compare-rule').textContent,
          title: document.querySelector('#compare-title').textContent,
          unknown: document.querySelector('#unknown-run'),
          status: document.querySelector('#status').textContent};
"""


def _shown(chrome: webdriver.Chrome, ready: Any) -> dict[str, Any]:
    """What the page shows once ``ready(shown)`` holds (within 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        got: dict[str, Any] = chrome.execute_script(SHOWN)
        got["unknown"] = chrome.execute_script(
            "const p = document.querySelector('#unknown-run'); return [p.hidden, p.textContent];"
        )
        if ready(got):
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.2)


def _compare(url: str, baseline: str, candidate: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/compare/{baseline}/{candidate}", timeout=10) as r:
        found: dict[str, Any] = orjson.loads(r.read())
    return found


def _number(text: str | None) -> float | None:
    return None if text in (None, "null") else float(text)  # JS prints the shortest round trip


@pytest.mark.parametrize("size", list(SIZES))
def test_the_compare_view_shows_the_comparison(
    served: str, browser: webdriver.Chrome, size: str, tmp_path: Path
) -> None:
    browser.set_window_size(*SIZES[size])
    browser.get(f"{served}/?compare=baseline,candidate")
    got = _shown(browser, lambda g: not g["hidden"] and len(g["rows"]) == 3 and g["plots"] == 3)
    want = _compare(served, "baseline", "candidate")
    verdicts = {}
    for row, agent in zip(got["rows"], want["agents"], strict=True):
        assert row["agent"]["text"] == agent["agent"]
        for side, role in (("a", "baseline"), ("b", "candidate")):
            figures = agent[role]
            assert int(row[f"{side}_rollouts"]["value"]) == figures["rollouts"]
            assert _number(row[f"{side}_mean"]["value"]) == figures["mean"]
            assert _number(row[f"{side}_lower"]["value"]) == figures["lower"]
            assert _number(row[f"{side}_lower"]["upper"]) == figures["upper"]
        assert _number(row["difference"]["value"]) == agent["difference"]
        assert _number(row["lower"]["value"]) == agent["lower"]
        assert _number(row["lower"]["upper"]) == agent["upper"]
        verdicts[agent["agent"]] = row["verdict"]["value"]
    assert verdicts["math"] == "better" and verdicts["code"] == "worse", verdicts
    assert verdicts["judge"] in ("undecided", "no difference larger than the noise floor")
    assert "anytime-valid 95% interval" in got["rule"] and "+0.01 (the noise floor)" in got["rule"]
    assert got["title"] == "candidate against baseline" and got["status"].startswith("live")
    assert got["inside"] and not got["wide"], got["wide"]
    browser.save_screenshot(str(tmp_path / "page-compare.png"))
    if os.environ.get("REWARDSTREAM_SCREENSHOTS") == "docs" and size == "desktop":
        shutil.copy(tmp_path / "page-compare.png", DOCS / "page-compare.png")


def test_an_unknown_run_is_said_so(served: str, browser: webdriver.Chrome) -> None:
    browser.get(f"{served}/?compare=baseline,nope")
    got = _shown(browser, lambda g: g["unknown"][0] is False)
    assert got["unknown"][1].startswith('This processor knows no run "nope"'), got["unknown"]
    assert got["hidden"] is True
    with pytest.raises(urllib.error.HTTPError) as answer:
        _compare(served, "nope", "candidate")
    assert answer.value.code == 404 and b"nope" in answer.value.read()


def test_two_runs_ticked_in_the_runs_table_are_compared(
    served: str, browser: webdriver.Chrome
) -> None:
    """The first run ticked is the baseline; the button leads to their comparison."""
    browser.get(served + "/")
    _shown(browser, lambda g: g["status"].startswith("live"))
    for run_id in ("candidate", "baseline"):  # found and clicked at once: rows are redrawn
        browser.execute_script(
            f"document.querySelector('#runs tr[data-run={run_id}] input').click()"
        )
    browser.find_element("css selector", "#compare-button").click()
    got = _shown(browser, lambda g: not g["hidden"] and len(g["rows"]) == 3)
    assert browser.current_url.endswith("/?compare=candidate,baseline")
    assert got["title"] == "baseline against candidate"
    verdicts = {row["agent"]["text"]: row["verdict"]["value"] for row in got["rows"]}
    assert verdicts["math"] == "worse" and verdicts["code"] == "better", verdicts
