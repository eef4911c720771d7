/*
 * The staff evaluation page (evaluation.html): the golden set's size, "Run evaluation" (POST,
 * then polling while a run is queued or running), every run as a table row, the finished runs'
 * scores as a chart over time (the dashboard's canvas chart), and a run's questions one by one
 * ("Details", or #run-<id> in the address).
 *
 * Hooks for the browser tests: #run-button, #evaluation-status, #golden-summary,
 * #runs-table tr[data-run-id][data-status] (.run-details), #evaluation-chart (data-points),
 * #run-detail #results-table tr.result-row.
 */

import { LANGUAGE, formatDateTime, formatNumber, gettext, interpolate, ngettext } from "../chat/i18n.js";
import { drawLineChart } from "../dashboard/charts.js";
import { el } from "../dashboard/elements.js";

const config = JSON.parse(document.getElementById("evaluation-config").textContent);
const runButton = document.getElementById("run-button");
const statusEl = document.getElementById("evaluation-status");
const summaryEl = document.getElementById("golden-summary");
const runsTable = document.getElementById("runs-table");
const chart = document.getElementById("evaluation-chart");
const detail = document.getElementById("run-detail");
const POLL_MS = 2000;
const MIN_SPAN_S = 3600;
// The run's figures in table order, with their labels (read when shown, in the page's language).
const METRICS = [
  ["recall1", () => gettext("Recall@1")],
  ["recall5", () => gettext("Recall@5")],
  ["ndcg10", () => gettext("nDCG@10")],
  ["mrr10", () => gettext("MRR@10")],
  ["answer_f1", () => gettext("Answer F1")],
  ["answer_contained", () => gettext("Contains the answer")],
];
// Charted with short labels, so the legend fits a phone.
const CHARTED = [
  ["recall5", () => gettext("Recall@5")],
  ["ndcg10", () => gettext("nDCG@10")],
  ["answer_f1", () => gettext("F1")],
  ["answer_contained", () => gettext("Contains")],
];

function dateFormat(options) {
  try {
    return new Intl.DateTimeFormat(LANGUAGE, options);
  } catch (error) {
    return new Intl.DateTimeFormat(undefined, options);
  }
}
// The x axis: hours and minutes over a day or less, else the day.
const clockTime = dateFormat({ hour: "2-digit", minute: "2-digit" });
const dayTime = dateFormat({ month: "short", day: "numeric" });

let runs = [];
let pollTimer = null;
let shownRun = null;

function score(value) {
  return typeof value === "number" ? formatNumber(value, 3) : "–";
}

async function request(method, url) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") {
    const token = document.cookie.split("; ").find((part) => part.startsWith("csrftoken="));
    headers["X-CSRFToken"] = token ? decodeURIComponent(token.slice("csrftoken=".length)) : "";
  }
  const response = await fetch(url, { method, headers, credentials: "same-origin" });
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    body = null;
  }
  if (!response.ok) {
    const message = body && body.error ? body.error.message : interpolate(gettext("The request failed (%(status)s)."), { status: response.status });
    throw new Error(message);
  }
  return body;
}

function renderSummary(golden) {
  const count = golden.active;
  let text = interpolate(ngettext("%(count)s active golden question.", "%(count)s active golden questions.", count), { count: formatNumber(count) });
  if (golden.without_answer) {
    text += " " + interpolate(ngettext("%(count)s has no expected answer and scores retrieval only.", "%(count)s have no expected answer and score retrieval only.", golden.without_answer), { count: formatNumber(golden.without_answer) });
  }
  summaryEl.textContent = text;
}

function renderRuns() {
  const head = el(
    "tr",
    null,
    el("th", { scope: "col", text: gettext("Started") }),
    el("th", { scope: "col", text: gettext("Status") }),
    el("th", { scope: "col", text: gettext("Model") }),
    el("th", { scope: "col", text: gettext("Embedding model") }),
    el("th", { scope: "col", text: gettext("Questions") }),
    ...METRICS.map(([, label]) => el("th", { scope: "col", text: label() })),
    el("th", { scope: "col", text: gettext("Details") })
  );
  const rows = runs.map((run) => {
    const status = el("td", { class: "status-" + run.status, text: run.status_label });
    const row = el(
      "tr",
      { "data-run-id": run.id, "data-status": run.status, id: "run-" + run.id, class: shownRun === run.id ? "selected" : null },
      el("th", { scope: "row", text: formatDateTime(run.created_at) }),
      status,
      el("td", { class: "text", text: run.model || "–" }),
      el("td", { class: "text", text: run.embedding_model || "–" }),
      el("td", { text: formatNumber(run.num_questions) }),
      ...METRICS.map(([key]) => el("td", { "data-metric": key, text: score(run.metrics[key]) })),
      el("td", null, el("button", { type: "button", class: "link-button run-details", "data-run-id": run.id, text: gettext("Details") }))
    );
    if (run.error) {
      return [row, el("tr", { class: "run-error-row" }, el("td", { class: "run-error", colspan: 6 + METRICS.length, role: "alert", text: run.error }))];
    }
    return [row];
  });
  runsTable.replaceChildren(el("thead", null, head), el("tbody", null, ...rows.flat()));
  if (!runs.length) {
    runsTable.append(el("caption", { text: gettext("No evaluation has run yet.") }));
  }
}

function renderChart() {
  const done = runs.filter((run) => run.status === "done" && run.finished_at).slice().reverse();
  const times = done.map((run) => Date.parse(run.finished_at) / 1000);
  let start = times.length ? Math.min(...times) : Date.now() / 1000 - MIN_SPAN_S;
  let end = times.length ? Math.max(...times) : Date.now() / 1000;
  if (end - start < MIN_SPAN_S) {
    // a lone run (or runs minutes apart) sits mid-chart, the axis an hour wide
    const middle = (start + end) / 2;
    [start, end] = [middle - MIN_SPAN_S / 2, middle + MIN_SPAN_S / 2];
  }
  drawLineChart(chart, {
    series: CHARTED.map(([key, label]) => ({ label: label(), points: done.map((run, i) => [times[i], run.metrics[key]]) })),
    start,
    end,
    yMax: 1,
    formatValue: (value) => formatNumber(value, 2),
    formatTime: (t) => (end - start <= 86400 ? clockTime : dayTime).format(new Date(t * 1000)),
    emptyText: gettext("No finished run yet."),
  });
}

function renderStatus() {
  const active = runs.find((run) => run.status === "queued" || run.status === "running");
  runButton.disabled = !!active;
  if (active) {
    statusEl.textContent = interpolate(gettext("Run %(id)s: %(status)s…"), { id: active.id, status: active.status_label });
  } else if (runs.length && runs[0].status === "done") {
    statusEl.textContent = interpolate(gettext("Run %(id)s finished."), { id: runs[0].id });
  } else if (runs.length && runs[0].status === "failed") {
    statusEl.textContent = interpolate(gettext("Run %(id)s failed: %(error)s"), { id: runs[0].id, error: runs[0].error });
  }
  clearTimeout(pollTimer);
  if (active) pollTimer = setTimeout(load, POLL_MS);
}

async function load() {
  try {
    const data = await request("GET", config.data_url);
    const wasActive = runs.some((run) => run.status === "queued" || run.status === "running");
    runs = data.runs;
    renderSummary(data.golden);
    renderRuns();
    renderChart();
    renderStatus();
    if (wasActive && shownRun === null && runs.length && runs[0].status !== "running") showRun(runs[0].id);
  } catch (error) {
    statusEl.textContent = error.message;
  }
}

function retrievedList(result) {
  if (!result.retrieved.length) return el("span", { text: "–" });
  return el(
    "ol",
    { class: "retrieved-list" },
    ...result.retrieved.slice(0, 5).map((hit) =>
      el("li", { class: hit.is_expected ? "expected" : null, text: hit.title + (hit.is_expected ? " ✓" : "") })
    )
  );
}

async function showRun(runId) {
  shownRun = runId;
  let data;
  try {
    data = await request("GET", config.run_url.replace(/0\/$/, runId + "/"));
  } catch (error) {
    statusEl.textContent = error.message;
    return;
  }
  renderRuns();
  const title = document.getElementById("run-detail-title");
  title.textContent = interpolate(gettext("Run %(id)s, question by question"), { id: runId });
  const head = el(
    "tr",
    null,
    el("th", { scope: "col", text: gettext("Question") }),
    el("th", { scope: "col", text: gettext("Expected answer") }),
    el("th", { scope: "col", text: gettext("Answer") }),
    el("th", { scope: "col", text: gettext("Top passages (expected marked)") }),
    ...METRICS.map(([, label]) => el("th", { scope: "col", text: label() }))
  );
  const rows = data.results.map((result) =>
    el(
      "tr",
      { class: "result-row" },
      el("th", { scope: "row", class: "text", text: result.question }),
      el("td", { class: "text", text: result.expected_answer || gettext("(none: retrieval only)") }),
      el("td", { class: "text" + (result.error ? " run-error" : ""), text: result.error || result.answer }),
      el("td", { class: "text" }, retrievedList(result)),
      ...METRICS.map(([key]) => el("td", { "data-metric": key, text: score(result.metrics[key]) }))
    )
  );
  const table = document.getElementById("results-table");
  table.replaceChildren(el("thead", null, head), el("tbody", null, ...rows));
  if (!rows.length) table.append(el("caption", { text: gettext("This run scored no question.") }));
  detail.hidden = false;
  detail.scrollIntoView({ block: "start" });
}

runButton.addEventListener("click", async () => {
  runButton.disabled = true;
  statusEl.textContent = gettext("Starting…");
  try {
    const data = await request("POST", config.start_url);
    shownRun = null;
    runs = [data.run, ...runs];
    renderRuns();
    renderStatus();
  } catch (error) {
    statusEl.textContent = error.message;
    runButton.disabled = false;
  }
});

runsTable.addEventListener("click", (event) => {
  const button = event.target.closest(".run-details");
  if (button) showRun(Number(button.dataset.runId));
});

let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(renderChart, 150);
});

load().then(() => {
  const match = /^#run-(\d+)$/.exec(window.location.hash);
  if (match) showRun(Number(match[1]));
});
