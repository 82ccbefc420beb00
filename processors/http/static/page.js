// rewardstream's live page: one EventSource (/events?run=ID) pushes the runs' summaries, the
// selected run's whole-run figures and its new history points; this script only draws them.
// /?compare=A,B shows run B against run A instead (/events?compare=A,B pushes the comparison).
"use strict";

const COLORS = ["#2f6fdb", "#e0672b", "#1f9d45", "#a23fc4", "#c83030", "#198a8a", "#8a6d1f", "#555"];
const $ = (sel) => document.querySelector(sel);

let selected = null;   // the run shown (from /runs/<id>, or picked automatically)
let pinned = false;    // chosen by the user (URL or click): never switched automatically
let source = null;     // the EventSource
let timeline = [];     // the selected run's history points, oldest first
let charts = {};       // uPlot instances by name
let chartKey = "";     // the agents (and ks) the charts were built for
let kRange = [1, 2];   // pass@k's x axis: from the smallest k to the largest
let ticked = [];       // runs ticked to compare, the baseline first

// [baseline, candidate] of /?compare=A,B (run ids have no comma), or null
const pair = (() => {
  const ids = (new URLSearchParams(location.search).get("compare") || "").split(",");
  return ids.length === 2 && ids[0] && ids[1] ? ids : null;
})();

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
    const tick = document.createElement("input");
    tick.type = "checkbox";
    tick.checked = ticked.includes(run.run_id);
    tick.setAttribute("aria-label", "compare " + run.run_id);
    tick.addEventListener("click", (event) => { event.stopPropagation(); toggle(run.run_id); });
    cell(row, "", "tick", undefined, false).append(tick);
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
    cell(row, run.rate === null ? "-" : run.rate.toFixed(run.rate < 10 ? 1 : 0), "rate", run.rate);
    cell(row, duration(run.eta_seconds), "eta", run.eta_seconds);
    cell(row, failed(run.failed_attempts, run.failure_rate), "failed", run.failed_attempts);
    cell(row, run.duplicates_dropped, "duplicates", run.duplicates_dropped);
    row.addEventListener("click", () => {
      if (pair) location.href = "/runs/" + encodeURIComponent(run.run_id);  // leave the comparison
      else choose(run.run_id, true);
    });
  }
}

// The first run ticked is the baseline, the second the candidate; a third replaces the second.
function toggle(runId) {
  ticked = ticked.includes(runId) ? ticked.filter((r) => r !== runId)
    : [...ticked.slice(0, 1), runId];
  $("#compare-button").disabled = ticked.length !== 2;
  for (const box of document.querySelectorAll("#runs tbody tr")) {
    box.querySelector("input").checked = ticked.includes(box.dataset.run);
  }
}

function unknownRuns(ids, runs) {
  const unknown = $("#unknown-run");
  unknown.hidden = !ids.length;
  unknown.textContent = ids.map((id) => `This processor knows no run "${id}"`).join("; ") +
    (runs.length ? ": the runs it knows are listed above." : ".");
}

const VERDICT = { better: "better", worse: "worse", undecided: "undecided",
  "no difference larger than the noise floor": "same", "no interval": "none" };
const pct = (n) => `${(100 * n).toFixed(1)}%`;
const percent = (x) => Number((100 * x).toFixed(4));  // 97.5, not 97.50000000000001
const signed = (v, digits = 3) => v === null ? "-" : (v >= 0 ? "+" : "") + v.toFixed(digits);
const span = (lo, hi, signs = false) => lo === null ? "-"
  : signs ? `${signed(lo)} ${signed(hi)}` : `${fmt(lo)} - ${fmt(hi)}`;

function badge(verdict) {
  const b = document.createElement("span");
  b.className = "verdict " + VERDICT[verdict];
  b.textContent = verdict;
  return b;
}

// One row of a plot: a band from lower to upper and a dot at the value, on [lo, hi].
function track(what, value, lower, upper, scale, color, marks = []) {
  const row = document.createElement("div");
  row.className = "track-row";
  row.innerHTML = `<span class="what"></span><div class="track"></div>`;
  row.querySelector(".what").textContent = what;
  const box = row.querySelector(".track");
  const at = (x) => Math.min(1, Math.max(0, (x - scale[0]) / (scale[1] - scale[0])));
  for (const mark of marks) box.append(mark(at));
  if (lower !== null) {
    const band = document.createElement("div");
    band.className = "band";
    band.style.left = pct(at(lower));
    band.style.width = pct(at(upper) - at(lower));
    band.style.background = color;
    box.append(band);
  }
  if (value !== null) {
    const dot = document.createElement("div");
    dot.className = "dot";
    dot.style.left = pct(at(value));
    dot.style.background = color;
    box.append(dot);
  }
  return row;
}

function scaleRow(scale, signs) {
  const row = document.createElement("div");
  row.className = "track-row";
  row.innerHTML = "<span class=\"value\"><span></span><span></span></span>";
  const [lo, hi] = row.querySelectorAll(".value span");
  lo.textContent = signs ? signed(scale[0]) : scale[0].toFixed(3);
  hi.textContent = signs ? signed(scale[1]) : scale[1].toFixed(3);
  return row;
}

function plot(row, c) {
  const figure = document.createElement("figure");
  figure.className = "pair";
  figure.dataset.agent = row.agent;
  const caption = document.createElement("figcaption");
  caption.append(row.agent, badge(row.verdict));
  figure.append(caption);
  const a = row.baseline, b = row.candidate, d = c.noise_floor;
  const ends = [a.lower, a.upper, b.lower, b.upper, a.mean, b.mean].filter((v) => v !== null);
  if (!ends.length) return figure;
  const lo = Math.min(...ends), hi = Math.max(...ends), room = Math.max(hi - lo, 0.01) * 0.1;
  const means = [lo - room, hi + room];
  figure.append(track("A", a.mean, a.lower, a.upper, means, COLORS[0]),
    track("B", b.mean, b.lower, b.upper, means, COLORS[1]), scaleRow(means, false));
  const far = Math.max(...[row.lower, row.upper, row.difference, 2 * d]
    .filter((v) => v !== null).map(Math.abs), 0.01) * 1.1;
  const diff = [-far, far];
  const floor = (at) => Object.assign(document.createElement("div"), { className: "floor",
    style: `left:${pct(at(-d))};width:${pct(at(d) - at(-d))}` });
  const zero = (at) => Object.assign(document.createElement("div"), { className: "zero",
    style: `left:${pct(at(0))}` });
  figure.append(track("B - A", row.difference, row.lower, row.upper, diff, COLORS[2],
    [floor, zero]), scaleRow(diff, true));
  return figure;
}

function renderCompare(c, runs) {
  unknownRuns(c.unknown, runs);
  $("#compare").hidden = c.unknown.length > 0;
  if (c.unknown.length) return;
  const [a, b] = [c.baseline, c.candidate];
  $("#compare-title").textContent = `${b.run_id} against ${a.run_id}`;
  $("#compare-runs").textContent = `A (baseline): ${a.run_id}, ${a.state}, ${a.rollouts} ` +
    `rollouts - B (candidate): ${b.run_id}, ${b.state}, ${b.rollouts} rollouts`;
  const level = percent(c.level), each = percent(c.run_level), d = c.noise_floor;
  $("#compare-rule").textContent = `B - A is the candidate's mean reward minus the ` +
    `baseline's, per agent, with an anytime-valid ${level}% interval: valid however often you ` +
    `look, whatever the runs' numbers of rollouts. Each run's band is its own interval at ` +
    `${each}%, and the difference's is [lower B - upper A, upper B - lower A]. The verdict: ` +
    `better when the interval is above +${d} (the noise floor), worse when it is below -${d}, ` +
    `no difference larger than the noise floor when it lies within [-${d}, +${d}], otherwise ` +
    `undecided; a wrong "better" or "worse" at any moment has a probability of at most ` +
    `${percent((1 - c.level) / 2)}%, per agent.`;
  for (const th of document.querySelectorAll("[data-run-level]")) {
    th.textContent = `${th.dataset.runLevel} ${each}% interval`;
  }
  $("#compare-level").textContent = `${level}% interval`;
  const body = $("#compare-agents tbody");
  body.replaceChildren();
  for (const r of c.agents) {
    const row = body.insertRow();
    row.dataset.agent = r.agent;
    row.title = r.reason || "";
    cell(row, r.agent, "agent", undefined, false);
    for (const [side, s] of [["a", r.baseline], ["b", r.candidate]]) {
      cell(row, s.rollouts, side + "_rollouts", s.rollouts);
      cell(row, fmt(s.mean), side + "_mean", s.mean);
      cell(row, span(s.lower, s.upper), side + "_lower", s.lower).dataset.upper = s.upper;
    }
    cell(row, signed(r.difference), "difference", r.difference);
    cell(row, span(r.lower, r.upper, true), "lower", r.lower).dataset.upper = r.upper;
    cell(row, "", "verdict", r.verdict, false).append(badge(r.verdict));
  }
  const notes = c.agents.filter((r) => r.reason).map((r) => `${r.agent}: ${r.reason}`);
  for (const role of ["baseline", "candidate"]) {
    if (c["only_in_" + role].length) notes.push(`only in the ${role}: ${c["only_in_" + role].join(", ")}`);
  }
  $("#compare-only").textContent = notes.join("; ");
  $("#compare-plots").replaceChildren(...c.agents.map((r) => plot(r, c)));
}

// The agents' intervals are at the processor's --level (level: 0.9 says "90% interval").
function renderRun(run, level) {
  $("#agents-level").textContent = `${percent(level)}% interval`;
  $("#mean-caption").textContent =
    `Mean reward over time, its ${percent(level)}% interval as a band`;
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
    const band = r.interval || {};
    cell(row, band.lower === null || band.lower === undefined ? "-"
      : `${fmt(band.lower)} - ${fmt(band.upper)}`, "interval", band.lower);
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

// -- axes that read right at any size and any age of a run ------------------------------------
const pad2 = (n) => String(n).padStart(2, "0");

// The decimals of the tick increment itself, so each label is its tick's value (0.2975, not
// 0.298; 0.25 steps keep two).
function decimals(incr) {
  let digits = 0;
  while (digits < 8 && Math.abs(incr * 10 ** digits - Math.round(incr * 10 ** digits)) > 1e-6) {
    digits += 1;
  }
  return digits;
}

function numberLabels(u, splits, axisIdx, space, incr) {
  const digits = decimals(incr);
  return splits.map((v) => v === null ? null : Number(v).toLocaleString("en-US", {
    minimumFractionDigits: digits, maximumFractionDigits: digits }));
}

// 24-hour local times, seconds only when ticks are under a minute apart, the date only when the
// axis spans more than a day: "12:09:30", "12:10", "11-27 12:00".
function timeLabels(u, splits, axisIdx, space, incr) {
  const scale = u.scales.x, longer = scale.max - scale.min > 86400;
  return splits.map((v) => {
    const d = new Date(v * 1000);
    const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
    const time = incr < 60 ? `${hm}:${pad2(d.getSeconds())}` : hm;
    return longer ? `${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${time}` : time;
  });
}

// An axis as wide as its widest label (uPlot's fixed 50 px cut "10,000" to "0,000").
function fitted(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  if (cycleNum > 1) return axis._size;
  const widest = (values || []).reduce((a, v) => (v !== null && String(v).length > a.length
    ? String(v) : a), "");
  u.ctx.font = axis.font[0];
  const text = widest ? u.ctx.measureText(widest).width / uPlot.pxRatio : 0;
  return Math.ceil(axis.ticks.size + axis.gap + text + 4);
}

const yAxis = (label) => ({ label, size: fitted, values: numberLabels });

function chart(name, opts, data, x = null) {
  const box = $("#chart-" + name);
  const width = Math.max(280, Math.min(box.clientWidth || 460, window.innerWidth - 24));
  if (charts[name]) charts[name].setData(data, x === null);
  else charts[name] = new uPlot({ width, height: 220, ...opts }, data, box);
  if (x !== null) charts[name].setScale("x", { min: x[0], max: x[1] });
}

function agentSeries(agents, extra = {}) {
  return agents.map((a, i) => ({ label: a, stroke: COLORS[i % COLORS.length], ...extra }));
}

// Per agent its mean, then the interval's lower and upper ends, thin and dashed, the band
// between them filled: bands' series are 1-based, after the time column.
function meanSeries(agents) {
  return agents.flatMap((a, i) => {
    const stroke = COLORS[i % COLORS.length];
    const edge = { stroke, width: 1, dash: [4, 4], points: { show: false } };
    return [{ label: a, stroke }, { label: `${a} lower`, ...edge }, { label: `${a} upper`, ...edge }];
  });
}

function meanBands(agents) {
  return agents.map((a, i) => ({ series: [3 * i + 3, 3 * i + 2],
    fill: COLORS[i % COLORS.length] + "22" }));
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
  // the run's own span; a run seconds old (or one point) still gets a readable minute of axis
  const last = at.length ? at[at.length - 1] : Date.now() / 1000;
  const span = [Math.min(at.length ? at[0] : last, last - 60), last];
  const time = { scales: { x: { time: true } }, axes: [{ values: timeLabels, space: 70 }] };
  const ends = [column(1), column(5), column(6)];
  chart("mean", { ...time, axes: [...time.axes, yAxis()], series: [{}, ...meanSeries(agents)],
    bands: meanBands(agents) }, [at, ...agents.flatMap((a, i) => ends.map((e) => e[i]))], span);
  chart("std", { ...time, axes: [...time.axes, yAxis()], series: [{}, ...agentSeries(agents)] },
    [at, ...column(2)], span);
  chart("rollouts", { ...time, axes: [...time.axes, yAxis()], series: [{},
    { label: "rollouts", stroke: COLORS[0] }, { label: "failed attempts", stroke: COLORS[4] }] },
  [at, timeline.map((p) => p.rollouts), timeline.map((p) => p.failed ?? 0)], span);
  // k from the smallest to the largest a run has, a tick at each k
  kRange = ks.length ? [ks[0], ks[ks.length - 1] === ks[0] ? ks[0] + 1 : ks[ks.length - 1]]
    : [1, 2];
  chart("passk", {
    scales: { x: { time: false, distr: ks.length > 1 ? 3 : 1, log: 2, range: () => kRange },
      y: { range: [0, 100] } },
    axes: [{ label: "k", splits: () => ks, values: (u, splits) => splits.map(String) },
      yAxis()],
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
    axes: [{ label: "task mean reward", values: numberLabels }, yAxis("tasks")],
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
    axes: [{ label: "output tokens (from)", values: numberLabels }, yAxis("mean reward")],
    series: [{ label: "tokens" }, ...agentSeries(agents, { points: { show: true } })],
  }, [lows.map((low) => Math.max(low, 0.5)),
    ...agents.map((a) => lows.map((low) => bins(a).find((b) => b.from === low)?.mean ?? null))]);
}

function pick(runs) {
  // a run the user chose stays chosen (an unknown one is said so); one the user did not choose
  // follows the newest open run
  if (pinned) return selected;
  const open = runs.filter((r) => ["open", "stalled", "finished"].includes(r.state));
  const run = (open.length ? open : runs)[(open.length ? open : runs).length - 1];
  return run ? run.run_id : null;
}

function live() {
  const status = $("#status");
  status.className = "status live";
  status.textContent = "live, updated " + new Date().toLocaleTimeString();
}

function connect() {
  if (source) source.close();
  const query = pair ? "?compare=" + pair.map(encodeURIComponent).join(",")
    : selected ? "?run=" + encodeURIComponent(selected) : "";
  source = new EventSource("/events" + query);
  timeline = [];
  source.onmessage = (event) => {
    const data = JSON.parse(event.data);
    if (pair) {
      renderRuns(data.runs);
      renderCompare(data.compare, data.runs);
      live();
      return;
    }
    const wanted = pick(data.runs);
    if (wanted !== selected) { choose(wanted, pinned); return; }  // "live" once it is drawn
    const last = timeline.length ? timeline[timeline.length - 1].at : -Infinity;
    timeline.push(...data.history.filter((p) => p.at > last));
    renderRuns(data.runs);
    if (data.run) renderRun(data.run, data.level);
    else $("#run").hidden = true;
    const unknown = pinned && selected && !data.runs.some((r) => r.run_id === selected);
    unknownRuns(unknown ? [selected] : [], data.runs);
    live();
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

$("#compare-button").addEventListener("click", () => {
  location.href = "/?compare=" + ticked.map(encodeURIComponent).join(",");
});
const match = location.pathname.match(/^\/runs\/([^/]+)$/);
if (pair) { ticked = [...pair]; $("#compare-button").disabled = false; connect(); }
else if (match) choose(decodeURIComponent(match[1]), true);
else choose(null, false);
