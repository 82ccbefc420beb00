"""The live page reads right at any size and any age of a run: in Debian's headless Chromium at
1400x1000, 1024x768 and a phone's width, for runs of 1, 10 and 1,000 history points and of 1
and 5 agents, every chart's axis labels are distinct, fit the room the axis has, a time axis
spans the run (not years), and the pass@k axis ends at the largest k; the interval's column and
band say the processor's level.

The processor's own HTTP face serves the page (``add_page`` over a real ``Pipeline`` fed in
process); only the run's history points are planted, since 1,000 of them take an hour to sample.
``REWARDSTREAM_SCREENSHOTS=docs`` saves the screenshots the README shows (1,000 points, 5 agents,
one per size) into ``docs/``.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from rewardstream.contract.events import RunStarted, encode
from rewardstream.processors.engine.live import History
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.http.page import HISTORY_EVERY, LiveView, add_page
from rewardstream.processors.http.server import make_app
from rewardstream.producers.events import input_events, rollout_events
from tests.processes import run_detail, serving

DOCS = Path(__file__).parent.parent / "docs"
SIZES = {"desktop": (1400, 1000), "laptop": (1024, 768), "phone": (390, 844)}
AGENTS = ["arithmetic_simple_agent", "math_with_judge", "blackjack", "code_gen", "x"]
RUN = "axes-run"
K = 6  # rollouts per task: pass@k's largest k


def collection(folder: Path, agents: int, tasks: int = 60) -> tuple[Path, Path]:
    """``agents`` agents, ``tasks`` tasks of ``K`` rollouts, rewards 0/1 of varied pass rates."""
    rng = random.Random(agents)
    folder.mkdir(parents=True)
    inputs, rollouts = folder / "r_materialized_inputs.jsonl", folder / "r.jsonl"
    with inputs.open("wb") as ins, rollouts.open("wb") as outs:
        for task in range(tasks):
            agent = AGENTS[task % agents]
            rate = rng.random()
            for rollout in range(K):
                row = {
                    "responses_create_params": {"input": f"question {task}"},
                    "agent_ref": {"name": agent},
                    "_ng_task_index": task,
                    "_ng_rollout_index": rollout,
                }
                ins.write(orjson.dumps(row) + b"\n")
                tokens = rng.randint(1, 4000)
                usage = {"input_tokens": 50, "output_tokens": tokens, "total_tokens": tokens + 50}
                result = row | {"response": {"usage": usage}, "reward": float(rng.random() < rate)}
                outs.write(orjson.dumps(result) + b"\n")
    return inputs, rollouts


def planted(view: LiveView, points: int, agents: int) -> None:
    """``points`` history points ending now, ``HISTORY_EVERY`` apart, the last one the run's
    own figures (so the sampler adds none)."""
    run = view.pipeline.runs[RUN]
    history = History(HISTORY_EVERY)
    now = time.time()
    rng = random.Random(points)
    for i in range(points):
        share = (i + 1) / points
        at = now - (points - 1 - i) * HISTORY_EVERY
        figures = {  # a mean settling towards each agent's own level, as a run's does
            a: [
                round(run.rollouts * share / agents),
                0.3 + 0.1 * j + 0.2 * math.exp(-6 * share) + 0.01 * rng.random(),
                0.45 - 0.05 * share,
                0.0,
                1.0,
            ]
            for j, a in enumerate(AGENTS[:agents])
        }
        history.add(at, {"rollouts": round(run.rollouts * share), "failed": 0, "agents": figures})
    history.points[-1]["rollouts"] = run.rollouts
    view.histories[RUN] = history


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The page of a run of ``request.param`` = (history points, agents), at its URL."""
    points, agents = request.param
    inputs, rollouts = collection(tmp_path / "data", agents)
    pipeline = Pipeline(tmp_path / "state")
    request.addfinalizer(pipeline.close)
    for event in [*input_events(inputs, RUN), *rollout_events(rollouts, RUN)]:
        pipeline.handle(event.kind, event.value)
    started = RunStarted(run_id=RUN, expected_rollouts=2 * 60 * K, output_stem="r")
    pipeline.handle("control", encode(started))
    view = LiveView(pipeline)
    planted(view, points, agents)
    app = web.Application()
    add_page(app, view)
    with serving(app) as url:
        yield url + "/"


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium and chromium-driver are not installed (.ci/system-deps)")
        pytest.skip("chromium and chromium-driver are not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield chrome
    finally:
        chrome.quit()


AXES = """
  const out = {};
  const ctx = document.createElement('canvas').getContext('2d');
  for (const [name, u] of Object.entries(charts)) {
    out[name] = u.axes.map((axis, i) => {
      if (!axis.show) return null;
      ctx.font = axis.font[0];
      const labels = (axis._values || []).filter((v) => v !== null).map(String);
      const lines = labels.flatMap((v) => v.split('\\n'));
      const incr = axis._found ? axis._found[1] : null;
      const off = (axis._splits || []).map((v, j) => axis._values[j] === null || u.scales[
        axis.scale].time ? 0 : Math.abs(Number(String(axis._values[j]).replace(/,/g, '')) - v));
      return {side: axis.side, size: axis._size, labels, incr, off: Math.max(0, ...off),
              widest: Math.max(0, ...lines.map((v) => ctx.measureText(v).width)),
              gap: axis.gap, ticks: axis.ticks.size, min: u.scales[axis.scale].min,
              max: u.scales[axis.scale].max, scale: axis.scale};
    });
  }
  return {axes: out, status: document.querySelector('#status').textContent,
          title: document.querySelector('#run-title').textContent};
"""


def shown(chrome: webdriver.Chrome) -> dict[str, Any]:
    """Each chart's axes as drawn, once the run and its charts are on the page."""
    deadline = time.monotonic() + 30
    while True:
        got: dict[str, Any] = chrome.execute_script(
            "return typeof charts === 'object' && Object.keys(charts).length === 6 ? "
            f"(() => {{ {AXES} }})() : null"
        )
        if got is not None and got["title"] == RUN:
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.2)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize(
    "served", [(1, 1), (10, 5), (1000, 5), (1000, 1)], indirect=True, ids=lambda p: f"{p[0]}x{p[1]}"
)
def test_axes_read_right(
    served: str, browser: webdriver.Chrome, size: str, tmp_path: Path, request: Any
) -> None:
    points, agents = request.node.callspec.params["served"]
    width, height = SIZES[size]
    browser.set_window_size(width, height)
    browser.get(served)
    got = shown(browser)
    span_end = time.time()
    problems = []
    for name, axes in got["axes"].items():
        for axis in axes:
            if axis is None:
                continue
            labels = axis["labels"]
            where = f"{name} axis {axis['scale']}"
            if len(labels) != len(set(labels)):
                problems.append(f"{where}: repeated labels {labels}")
            room = axis["size"] - axis["gap"] - axis["ticks"]
            if axis["side"] in (1, 3) and axis["widest"] > room + 0.5:  # a y axis
                problems.append(f"{where}: labels {labels} {axis['widest']:.0f} px in {room} px")
            if axis["scale"] == "x" and name in ("mean", "std", "rollouts"):
                first = span_end - (points - 1) * HISTORY_EVERY
                if axis["min"] < first - 3600 or axis["max"] > span_end + 3600:
                    problems.append(f"{where}: {axis['min']}..{axis['max']} beyond the run")
            if axis["incr"] and axis["off"] > axis["incr"] / 100:
                problems.append(f"{where}: labels {labels} are not their ticks' values")
            if name == "passk" and axis["scale"] == "x" and axis["max"] > K + 0.5:
                problems.append(f"{where}: runs to {axis['max']}, the largest k is {K}")
    shot = f"page-{size}.png"
    browser.save_screenshot(str(tmp_path / shot))
    if os.environ.get("REWARDSTREAM_SCREENSHOTS") == "docs" and (points, agents) == (1000, 5):
        shutil.copy(tmp_path / shot, DOCS / shot)  # the README's, one per size
    assert not problems, "\n".join(problems)


WATCH_STATUS = """
  window.__seen = [];
  new MutationObserver(() => {
    const status = document.querySelector('#status');
    if (status) window.__seen.push({status: status.textContent,
      title: document.querySelector('#run-title')?.textContent ?? '',
      noRuns: !document.querySelector('#no-runs')?.hidden});
  }).observe(document, {subtree: true, childList: true, characterData: true});
"""


@pytest.mark.parametrize("served", [(10, 5)], indirect=True, ids=["10x5"])
def test_the_first_paint_that_says_live_shows_the_run(
    served: str, browser: webdriver.Chrome
) -> None:
    """The badge says "live" only with the run drawn: never over "No run yet" while runs
    exist (watched from before the page's own script runs)."""
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_STATUS})
    browser.get(served)
    shown(browser)
    seen = browser.execute_script("return window.__seen")
    live = [s for s in seen if s["status"].startswith("live")]
    assert live and all(s["title"] == RUN and not s["noRuns"] for s in live), seen


@pytest.mark.parametrize("served", [(10, 5)], indirect=True, ids=["10x5"])
def test_an_unknown_run_is_said_so(served: str, browser: webdriver.Chrome) -> None:
    browser.get(served)
    shown(browser)  # the app serves the page at / only; the script reads the path
    browser.execute_script("history.pushState(null, '', '/runs/nope'); choose('nope', true);")
    deadline = time.monotonic() + 30
    while True:
        said = browser.execute_script(
            "const p = document.querySelector('#unknown-run');"
            "return [p.hidden, p.textContent, document.querySelector('#run').hidden];"
        )
        if said[0] is False:
            break
        assert time.monotonic() < deadline, said
        time.sleep(0.2)
    assert said[1].startswith('This processor knows no run "nope"') and said[2] is True, said


def test_the_interval_column_and_band_say_the_processors_level(
    tmp_path: Path, browser: webdriver.Chrome
) -> None:
    """A processor at ``--level 0.9`` (its HTTP face on loopback): the agents' table heads its
    interval column "90% interval" with each agent's ``/runs/<id>`` interval at 0.9, and the
    mean chart's caption says its band is that interval."""
    inputs, rollouts = collection(tmp_path / "data", 2)
    pipeline = Pipeline(tmp_path / "state", level=0.9)
    try:
        for event in [*input_events(inputs, RUN), *rollout_events(rollouts, RUN)]:
            pipeline.handle(event.kind, event.value)
        with serving(make_app(pipeline, None)) as url:
            browser.set_window_size(*SIZES["laptop"])
            browser.get(f"{url}/runs/{RUN}")
            detail = run_detail(url, RUN)
            deadline = time.monotonic() + 30
            while True:
                got = browser.execute_script(LEVEL_SHOWN)
                if len(got["lower"]) == len(detail["agents"]):
                    break
                assert time.monotonic() < deadline, got
                time.sleep(0.2)
    finally:
        pipeline.close()
    assert got["head"] == "90% interval"
    assert got["caption"] == "Mean reward over time, its 90% interval as a band"
    for agent, figures in detail["agents"].items():
        interval = figures["reward"]["interval"]
        assert interval["level"] == 0.9
        assert float(got["lower"][agent]) == interval["lower"]


LEVEL_SHOWN = """
  const lower = Object.fromEntries([...document.querySelectorAll('#agents tbody tr')].map(
    (tr) => [tr.dataset.agent, tr.querySelector('[data-field=interval]').dataset.value]));
  return {lower, head: document.querySelector('#agents-level').textContent,
          caption: document.querySelector('#mean-caption').textContent};
"""
