"""The live page in a real browser (Debian's headless Chromium, driven by selenium with the
system driver) against a real processor fed through a real broker: it shows the run, its agents,
the rollout count and per-agent mean reward equal to ``/runs/<id>`` and to a snapshot; it updates
itself as rollouts arrive (no reload); its download button gives the final files. And with two
processors, each on a private disk, each one's ``/runs/<id>`` is the whole run.

``REWARDSTREAM_SCREENSHOTS=docs`` also saves the screenshots the README shows into ``docs/``.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from rewardstream.contract.events import EventKind, RunFinished, Topics, encode
from rewardstream.processors.http.page import HISTORY_EVERY
from tests.golden import file_events, generated_collection
from tests.processes import Processor, make_topics, run_detail, send_events, trickle

pytestmark = pytest.mark.kafka
DOCS = Path(__file__).parent.parent / "docs"
CLI = [sys.executable, "-m", "rewardstream.commands.cli"]


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "chromium and chromium-driver are needed (.ci/system-deps)"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,1500"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(driver))  # no driver download
    try:
        yield chrome
    finally:
        chrome.quit()  # the browser and its driver: no process left behind


def _page(chrome: webdriver.Chrome) -> dict[str, Any]:
    """What the page shows: each run row's fields, and each agent row's (``data-value``, the
    exact number behind the rounded text)."""
    script = """
      const rows = (sel, key) => Object.fromEntries([...document.querySelectorAll(sel)].map(
        (tr) => [tr.dataset[key], Object.fromEntries([...tr.cells].filter((c) => c.dataset.field)
          .map((c) => [c.dataset.field, c.dataset.value ?? c.textContent]))]));
      return {runs: rows('#runs tbody tr', 'run'), agents: rows('#agents tbody tr', 'agent'),
              status: document.querySelector('#status').textContent,
              download: document.querySelector('#download').getAttribute('href'),
              label: document.querySelector('#download').textContent,
              marker: window.__marker ?? null};
    """
    shown: dict[str, Any] = chrome.execute_script(script)
    return shown


def _matches(shown: dict[str, Any], detail: dict[str, Any]) -> bool:
    run = shown["runs"].get(detail["run_id"])
    if run is None or int(run["rollouts"]) != detail["rollouts"] or run["state"] != detail["state"]:
        return False
    if set(shown["agents"]) != set(detail["agents"]):
        return False
    for name, agent in detail["agents"].items():
        row = shown["agents"][name]
        if int(row["rollouts"]) != agent["rollouts"]:
            return False
        if float(row["mean"]) != agent["reward"]["mean"]:  # JS prints the shortest round trip
            return False
    return True


def _until(chrome: webdriver.Chrome, url: str, run_id: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        detail = run_detail(url, run_id)
        shown = _page(chrome)
        if detail["state"] == state and _matches(shown, detail):
            return shown
        assert time.monotonic() < deadline, (shown, detail)
        time.sleep(0.3)


def _rollouts(run_id: str, n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda runs: bool(runs.get(run_id, {}).get("rollouts") == n)


def _screenshot(chrome: webdriver.Chrome, folder: Path, name: str) -> None:
    chrome.save_screenshot(str(folder / name))
    if os.environ.get("REWARDSTREAM_SCREENSHOTS") == "docs":
        DOCS.mkdir(exist_ok=True)
        shutil.copy(folder / name, DOCS / name)


def _agent_means(files: dict[str, bytes], stem: str) -> dict[str, float]:
    rows = json.loads(files[f"{stem}_agent_metrics.json"])
    return {row["agent_ref"]["name"]: row["mean/reward"] for row in rows}


def test_the_page_shows_the_run_live_in_a_browser(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    browser: webdriver.Chrome,
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=200, repeats=4, seed=5)
    prefix = unique_name("page")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 2))
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", tmp_path / "processor.log")
    processors.append(p)
    events = file_events(inputs, rollouts, "live", "r", True)
    data = [e for e in events if e[0] == "rollout"]
    send_events(kafka_bootstrap, topics, [e for e in events if e[0] == "input"], "live")
    send_events(kafka_bootstrap, topics, [events[-2]], "live")  # run_started
    for n in (100, 200, 300):  # in steps, a history point each (and a rate)
        send_events(kafka_bootstrap, topics, data[n - 100 : n], "live")
        p.wait(_rollouts("live", n))
        time.sleep(HISTORY_EVERY + 0.2)

    browser.get(p.url + "/")
    shown = _until(browser, p.url, "live", "open")
    assert shown["status"].startswith("live"), shown
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map((e) => e.name)"
    )
    assert {"uPlot.iife.min.js", "page.js"} <= {u.rsplit("/", 1)[-1] for u in loaded}
    assert all(u.startswith(p.url + "/") for u in loaded), loaded  # nothing from the internet
    assert shown["label"] == "Download snapshot (.zip)"
    with urllib.request.urlopen(p.url + shown["download"], timeout=60) as r:
        snapshot = zipfile.ZipFile(io.BytesIO(r.read()))
        assert r.headers["Content-Disposition"] == 'attachment; filename="r_snapshot.zip"'
    files = {n: snapshot.read(n) for n in snapshot.namelist()}
    detail = run_detail(p.url, "live")
    for agent, mean in _agent_means(files, "r").items():  # pandas' mean, our Welford
        assert math.isclose(detail["agents"][agent]["reward"]["mean"], mean, rel_tol=1e-12)
    browser.execute_script("window.__marker = 'no reload'")
    _screenshot(browser, tmp_path, "page-running.png")

    send_events(kafka_bootstrap, topics, [*data[300:], events[-1]], "live")
    shown = _until(browser, p.url, "live", "final")  # pushed, not reloaded
    assert shown["marker"] == "no reload"
    assert shown["label"] == "Download final files (.zip)"
    time.sleep(HISTORY_EVERY + 0.5)  # the last history point, drawn
    _screenshot(browser, tmp_path, "page-finished.png")
    with urllib.request.urlopen(p.url + shown["download"], timeout=60) as r:
        final = zipfile.ZipFile(io.BytesIO(r.read()))
    written = p.seen(tmp_path / "out" / "live")
    for name in final.namelist():
        assert final.read(name) == (written / name).read_bytes(), name

    browser.get(p.url + "/runs/live")  # the run's own address: the same page, that run
    _until(browser, p.url, "live", "final")
    browser.get(p.url + "/runs/nope")
    assert "unknown run_id" not in browser.page_source  # the page, which finds no such run


def test_the_page_shows_a_run_stalled_and_back_open(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
    browser: webdriver.Chrome,
) -> None:
    """A run whose events stop is stalled within ``--stall-after`` (rate 0, no ETA, how long
    since its last event, on the page, in ``/runs`` and ``/metrics``), and open again once its
    events resume."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=100, repeats=2, seed=7)
    prefix = unique_name("stall")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 2))
    stall = 3.0
    log = tmp_path / "processor.log"
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", log, extra=["--stall-after", "3"])
    processors.append(p)
    events = file_events(inputs, rollouts, "s", "r", False)
    data = [e for e in events if e[0] == "rollout"]
    send_events(kafka_bootstrap, topics, [*(e for e in events if e[0] == "input"), events[-1]], "s")
    send_events(kafka_bootstrap, topics, data[:100], "s")
    p.wait(_rollouts("s", 100))
    stopped = time.monotonic()  # the processor has had its last event by now
    browser.get(p.url + "/runs/s")
    shown = _until(browser, p.url, "s", "stalled")
    assert time.monotonic() - stopped < stall + 10  # within the stall time, and a push
    row = shown["runs"]["s"]
    assert (row["rate"], row["eta"]) == ("0", "-"), row
    cells = browser.execute_script(
        "return [document.querySelector('#runs tbody tr td[data-field=state]').textContent,"
        " document.querySelector('#run-facts').textContent]"
    )
    assert cells[0].startswith("stalled last event ") and "no event for" in cells[1], cells
    summary = p.runs()["s"]
    assert summary["rate"] == 0.0 and summary["eta_seconds"] is None
    assert isinstance(summary["last_event_seconds"], int) and summary["last_event_seconds"] >= 3
    with urllib.request.urlopen(p.url + "/metrics", timeout=10) as r:
        ages = [
            float(line.rsplit(" ", 1)[1])
            for line in r.read().decode().splitlines()
            if line.startswith('rewardstream_run_last_event_age_seconds{run_id="s"}')
        ]
    assert len(ages) == 1 and ages[0] >= stall
    with trickle(kafka_bootstrap, topics, data[100:], "s"):  # events resume
        _until(browser, p.url, "s", "open")


def test_any_processor_shows_the_whole_run(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=120, repeats=4, seed=6)
    prefix = unique_name("whole")
    topics = Topics.for_prefix(prefix)
    asyncio.run(make_topics(kafka_bootstrap, topics, 4))
    hosts = [
        Processor(
            kafka_bootstrap,
            prefix,
            tmp_path / "unused",
            tmp_path / f"p{i}.log",
            private_disk=tmp_path / f"host{i}",
        )
        for i in range(2)
    ]
    processors.extend(hosts)
    deadline = time.monotonic() + 60
    while not all(h.units() for h in hosts) or sum(len(h.units()) for h in hosts) != 8:
        assert time.monotonic() < deadline, [h.units() for h in hosts]
        time.sleep(0.2)
    *events, started = file_events(inputs, rollouts, "w", "r", False)
    assert started[0] == "control"  # held back: without it the run cannot end, and the open
    send_events(kafka_bootstrap, topics, events, "w")  # views have all the time to agree
    for h in hosts:
        h.wait(lambda runs: runs.get("w", {}).get("rollouts") == 480)

    expected = {
        r["agent_ref"]["name"]: r
        for r in json.loads((inputs.parent / "r_agent_metrics.json").read_text())
    }

    def same(details: list[dict[str, Any]]) -> bool:
        """Every view shows every rollout and task, the same figures, the batch's moments."""
        for detail in details:
            agents = detail["agents"]
            if sum(a["rollouts"] for a in agents.values()) != 480:
                return False
            if sum(a["tasks"]["tasks"] for a in agents.values()) != 120:
                return False  # a part's figures are renewed every 2 s at most
            if agents.keys() != expected.keys():
                return False
            for name, row in expected.items():
                reward = agents[name]["reward"]
                assert math.isclose(reward["mean"], row["mean/reward"], rel_tol=1e-12)
                assert math.isclose(reward["std"], row["std/reward"], rel_tol=1e-9)
                assert (reward["min"], reward["max"]) == (row["min/reward"], row["max/reward"])
                folded = reward["interval"]["sums"][0]  # in dispatch order, up to the cut
                if folded > agents[name]["rollouts"] or (
                    detail["state"] == "final" and folded != agents[name]["rollouts"]
                ):
                    return False
        first = details[0]["agents"]
        for other in details[1:]:
            for name, agent in other["agents"].items():
                mine = first[name]
                assert agent["tasks"] == mine["tasks"] and agent["rollouts"] == mine["rollouts"]
                sums, my_sums = (
                    agent["reward"]["interval"]["sums"],
                    mine["reward"]["interval"]["sums"],
                )
                if sums[0] != my_sums[0] or not all(  # one cut, from local and sent ladders
                    math.isclose(a, b, rel_tol=1e-9) for a, b in zip(sums, my_sums, strict=True)
                ):
                    return False
                assert agent["pass_at_k"].keys() == mine["pass_at_k"].keys()
                for k, value in agent["pass_at_k"].items():
                    assert math.isclose(value, mine["pass_at_k"][k], rel_tol=1e-12)
        return True

    def until(states: set[str], among: list[Processor]) -> None:
        deadline = time.monotonic() + 120  # 18 s alone; more than 60 s under a loaded suite
        while True:
            details = [run_detail(h.url, "w") for h in among]
            if all(d["state"] in states for d in details) and same(details):
                return
            shown = [
                (
                    d["state"],
                    d["rollouts"],
                    {
                        name: (a["rollouts"], a["tasks"]["tasks"], a["reward"]["interval"]["sums"])
                        for name, a in d["agents"].items()
                    },
                )
                for d in details
            ]
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)

    # each from its own parts and the other's member record; "stalled" is "open" after 60 s
    # without an event, which a loaded machine can take to get here
    until({"open", "stalled"}, hosts)
    finished: tuple[EventKind, bytes] = ("control", encode(RunFinished(run_id="w")))
    send_events(kafka_bootstrap, topics, [started, finished], "w")
    until({"final"}, hosts)  # from the final record
    late = Processor(
        kafka_bootstrap,
        prefix,
        tmp_path / "unused",
        tmp_path / "p2.log",
        private_disk=tmp_path / "host2",
    )
    processors.append(late)
    late.wait(lambda runs: runs.get("w", {}).get("state") == "final")
    until({"final"}, [*hosts, late])  # started after the final: the same figures


def test_publish_names_the_live_page(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    processors: list[Processor],
) -> None:
    """The start line names the run's page on a live processor of the topics, or says none
    serves them yet."""
    inputs, rollouts = generated_collection(tmp_path / "data", tasks=10, repeats=2, seed=8)
    prefix, lonely = unique_name("named"), unique_name("lonely")
    asyncio.run(make_topics(kafka_bootstrap, Topics.for_prefix(prefix), 2))
    p = Processor(kafka_bootstrap, prefix, tmp_path / "out", tmp_path / "processor.log")
    processors.append(p)
    deadline = time.monotonic() + 60
    while not p.units():  # assigned, hence announced
        assert time.monotonic() < deadline
        time.sleep(0.2)
    publish = [*CLI, "publish", "--inputs", str(inputs), "--rollouts", str(rollouts)]
    publish += ["--bootstrap", kafka_bootstrap, "--run-id", "named", "--topic-prefix"]
    for topic_prefix, expected in (
        (prefix, f"; live page: {p.url}/runs/named\n"),
        (lonely, "; live page: no processor is serving these topics yet"),
    ):
        proc = subprocess.run(
            [*publish, topic_prefix],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.startswith(f"publishing {rollouts} as run named")
        assert expected in proc.stderr, proc.stderr
