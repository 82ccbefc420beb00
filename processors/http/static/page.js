// rewardstream's live page: one EventSource (/events?run=ID) pushes the runs' summaries, the
// selected run's whole-run figures and its new history points; this script only draws them.
"use strict";

const COLORS = ["#2f6fdb", "#e0672b", "#1f9d45", "#a23fc4", "#c83030", "#198a8a", "#8a6d1f", "#555"];
const $ = (sel) => document.querySelector(sel);

let selected = null;   // the run shown (from /runs/<id>, or picked automatically)
let pinned = false;    // chosen by the user (URL or click): never switched automatically
let source = null;     // the EventSource
let timeline = [];     // the selected run's history points, oldest first
let charts = {};       // uPlot instances by name
let chartKey = "";     // the agents (and ks) the charts were built for

function fmt(value, digits = 4) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + (s % 60) + "s";
}

function failed(count, rate) {
  return rate === null || rate === undefined ? String(count || 0)
    : `${count} (${(100 * rate).toFixed(1)}%)`;
}

function cell(row, text, field, value, numeric = true) {
  const td = row.insertCell();
  td.textContent = text;
  if (numeric) td.className = "num";
  if (field) td.dataset.field = field;
  if (value !== undefined && value !== null) td.dataset.value = String(value);
  return td;
}

function renderRuns(runs) {
  const body = $("#runs tbody");
  body.replaceChildren();
  $("#no-runs").hidden = runs.length > 0;
  for (const run of runs) {
    const row = body.insertRow();
    row.dataset.run = run.run_id;
    if (run.run_id === selected) row.classList.add("selected");
    cell(row, run.run_id, "run_id", undefined, false);
    const state = cell(row, "", "state", run.state, false);
    const badge = document.createElement("span");
    badge.className = "state " + run.state;
    badge.textContent = run.state;
    state.append(badge);
    if (run.state === "stalled") state.append(` last event ${duration(run.last_event_seconds)} ago`);
    cell(row, run.rollouts, "rollouts", run.rollouts);
    cell(row, run.expected_rollouts ?? "-", "expected", run.expected_rollouts);
    const share = run.expected_rollouts ? Math.min(1, run.rollouts / run.expected_rollouts) : 0;
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.innerHTML = `<div style="width:${(100 * share).toFixed(1)}%"></div>`;
    cell(row, "", "progress", share, false).append(bar);
    cell(row, run.rate === null ? "-" : run.rate.toFixed(0), "rate", run.rate);
    cell(row, duration(run.eta_seconds), "eta", run.eta_seconds);
    cell(row, failed(run.failed_attempts, run.failure_rate), "failed", run.failed_attempts);
    cell(row, run.duplicates_dropped, "duplicates", run.duplicates_dropped);
    row.addEventListener("click", () => choose(run.run_id, true));
  }
}

function renderRun(run) {
  $("#run").hidden = false;
  $("#run-title").textContent = run.run_id;
  const done = run.state === "final";
  const link = $("#download");
  link.href = `/runs/${encodeURIComponent(run.run_id)}/download`;
  link.textContent = done ? "Download final files (.zip)" : "Download snapshot (.zip)";
  link.hidden = run.state === "evicted";
  const missing = run.partitions_missing.length
    ? ` - the figures leave out partitions ${run.partitions_missing.join(", ")}, whose ` +
      "processor sends no summary (see its log)" : "";
  const stalled = run.state === "stalled"
    ? ` (no event for ${duration(run.last_event_seconds)}: stopped, or stuck?)` : "";
  $("#run-facts").textContent =
    `${run.state}${stalled} - ${run.rollouts} of ${run.expected_rollouts ?? "?"} rollouts, ` +
    `${run.inputs} input rows, profile ${run.stem}_reward_profiling.jsonl${missing}`;
  const body = $("#agents tbody");
  body.replaceChildren();
  for (const [name, agent] of Object.entries(run.agents)) {
    const row = body.insertRow();
    row.dataset.agent = name;
    const r = agent.reward || {};
    cell(row, name, "agent", undefined, false);
    cell(row, agent.rollouts, "rollouts", agent.rollouts);
    cell(row, fmt(r.mean), "mean", r.mean);
    cell(row, fmt(r.std), "std", r.std);
    cell(row, fmt(r.min), "min", r.min);
    cell(row, fmt(r.max), "max", r.max);
    const fails = Object.values(agent.failed_attempts || {}).reduce((a, b) => a + b, 0);
    cell(row, failed(fails, agent.failure_rate), "failed", fails);
    cell(row, agent.tasks.tasks, "tasks", agent.tasks.tasks);
    const share = agent.tasks.zero_variance_share;
    cell(row, share === null ? "-" : (100 * share).toFixed(1) + "%", "zero_variance", share);
    const passes = Object.entries(agent.pass_at_k).map(([k, v]) => `@${k} ${v.toFixed(1)}`);
    cell(row, passes.join("  "), "pass_at_k", undefined, false);
  }
  drawCharts(run);
}

function chart(name, opts, data) {
  const box = $("#chart-" + name);
  const width = Math.max(300, box.clientWidth || 460);
  if (charts[name]) charts[name].setData(data);
  else charts[name] = new uPlot({ width, height: 220, ...opts }, data, box);
}

function agentSeries(agents, extra = {}) {
  return agents.map((a, i) => ({ label: a, stroke: COLORS[i % COLORS.length], ...extra }));
}

function drawCharts(run) {
  const agents = Object.keys(run.agents);
  const ks = [...new Set(agents.flatMap((a) => Object.keys(run.agents[a].pass_at_k)))]
    .map(Number).sort((a, b) => a - b);
  const key = agents.join("\u0000") + "|" + (ks.length > 1);  // series, and pass@k's scale
  if (key !== chartKey) {  // new agents or ks: build the charts again
    for (const c of Object.values(charts)) c.destroy();
    charts = {};
    chartKey = key;
  }
  const at = timeline.map((p) => p.at);
  const column = (i) => agents.map((a) => timeline.map((p) => (p.agents[a] || [])[i] ?? null));
  // one point (a burst, or a page opened on an idle run) still gets a readable minute of axis
  const span = (u, min, max) => (max - min < 60 ? [max - 60, max + 1] : [min, max]);
  const time = { scales: { x: { time: true, range: span } } };
  chart("mean", { ...time, series: [{}, ...agentSeries(agents)] }, [at, ...column(1)]);
  chart("std", { ...time, series: [{}, ...agentSeries(agents)] }, [at, ...column(2)]);
  chart("rollouts", { ...time, series: [{}, { label: "rollouts", stroke: COLORS[0] },
    { label: "failed attempts", stroke: COLORS[4] }] },
  [at, timeline.map((p) => p.rollouts), timeline.map((p) => p.failed ?? 0)]);
  chart("passk", {
    scales: { x: { time: false, distr: ks.length > 1 ? 3 : 1, log: 2 }, y: { range: [0, 100] } },
    axes: [{ label: "k" }, {}],
    series: [{ label: "k" }, ...agentSeries(agents, { points: { show: true } })],
  }, [ks, ...agents.map((a) => ks.map((k) => run.agents[a].pass_at_k[String(k)] ?? null))]);
  // grouped bars: agent i's bar of bin b sits at the i-th of n slots inside the bin
  const edges = agents.length ? run.agents[agents[0]].tasks.mean_reward.edges : [];
  const slots = agents.length + 1;
  const xs = [], ys = agents.map(() => []);
  edges.slice(0, -1).forEach((edge, b) => {
    agents.forEach((agent, i) => {
      xs.push(edge + ((edges[b + 1] - edge) * (i + 1)) / slots);
      ys.forEach((y, j) => y.push(j === i ? run.agents[agent].tasks.mean_reward.counts[b] : null));
    });
  });
  chart("difficulty", {
    scales: { x: { time: false, range: [0, 1] } },
    axes: [{ label: "task mean reward" }, { label: "tasks" }],
    series: [{ label: "mean" }, ...agentSeries(agents, {
      paths: uPlot.paths.bars({ size: [0.9, Infinity] }), points: { show: false },
    }).map((s) => ({ ...s, fill: s.stroke + "cc" }))],
  }, [xs, ...ys]);
  // power-of-two bins of output tokens, drawn at their lower bound (0 tokens: at 0.5)
  const bins = (a) => run.agents[a].reward_by_output_tokens;
  const lows = [...new Set(agents.flatMap((a) => bins(a).map((b) => b.from)))]
    .sort((a, b) => a - b);
  chart("tokens", {
    scales: { x: { time: false, distr: 3, log: 2 } },
    axes: [{ label: "output tokens (from)" }, { label: "mean reward" }],
    series: [{ label: "tokens" }, ...agentSeries(agents, { points: { show: true } })],
  }, [lows.map((low) => Math.max(low, 0.5)),
    ...agents.map((a) => lows.map((low) => bins(a).find((b) => b.from === low)?.mean ?? null))]);
}

function pick(runs) {
  // a run the user did not choose follows the newest open one
  if (pinned && runs.some((r) => r.run_id === selected)) return selected;
  const open = runs.filter((r) => ["open", "stalled", "finished"].includes(r.state));
  const run = (open.length ? open : runs)[(open.length ? open : runs).length - 1];
  return run ? run.run_id : null;
}

function connect() {
  if (source) source.close();
  const query = selected ? "?run=" + encodeURIComponent(selected) : "";
  source = new EventSource("/events" + query);
  timeline = [];
  source.onmessage = (event) => {
    const data = JSON.parse(event.data);
    const status = $("#status");
    status.className = "status live";
    status.textContent = "live, updated " + new Date().toLocaleTimeString();
    const wanted = pick(data.runs);
    if (wanted !== selected) { choose(wanted, pinned); return; }
    const last = timeline.length ? timeline[timeline.length - 1].at : -Infinity;
    timeline.push(...data.history.filter((p) => p.at > last));
    renderRuns(data.runs);
    if (data.run) renderRun(data.run);
    else $("#run").hidden = true;
  };
  source.onerror = () => {
    const status = $("#status");
    status.className = "status down";
    status.textContent = "reconnecting";
  };
}

function choose(runId, byUser) {
  pinned = byUser;
  if (runId === selected && source) return;
  selected = runId;
  for (const c of Object.values(charts)) c.destroy();
  charts = {};
  chartKey = "";
  if (byUser && runId) history.replaceState(null, "", "/runs/" + encodeURIComponent(runId));
  connect();
}

const match = location.pathname.match(/^\/runs\/([^/]+)$/);
if (match) choose(decodeURIComponent(match[1]), true);
else choose(null, false);
