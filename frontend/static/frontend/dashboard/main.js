/*
 * The staff performance dashboard (dashboard.html): polls /staff/dashboard/data/ and draws the
 * last hour of one model's metrics (cards and canvas charts), the backends' turns, and the last
 * benchmark run's optimization table. The server computes every number; this page only shows
 * them (see inference/dashboard_series.py for what each one covers).
 *
 * Hooks for the browser tests: #cards .card[data-metric], canvas[data-chart] (data-points once
 * drawn), #model-tabs button[data-model], #benchmark-table, #benchmark-chart.
 */

import { formatNumber, formatPercent, gettext, interpolate } from "../chat/i18n.js";
import { drawLineChart } from "./charts.js";
import { el } from "./elements.js";

const config = JSON.parse(document.getElementById("dashboard-config").textContent);
const cardsEl = document.getElementById("cards");
const tabsEl = document.getElementById("model-tabs");
const statusEl = document.getElementById("dashboard-status");
const MIN_POLL_MS = 5000;
const MIN_SPAN_S = 120;

let data = null;
let chosenModel = null;

function seconds(value) {
  return interpolate(gettext("%(seconds)s s"), { seconds: formatNumber(value, value < 1 ? 3 : 2) });
}

/** "0.31 s (0.25–0.5 s)": an estimate and the bucket it lies in. */
function percentileText(estimate) {
  if (!estimate) return "–";
  const bucket =
    estimate.upper === null
      ? interpolate(gettext("over %(lower)s s"), { lower: formatNumber(estimate.lower, 3) })
      : interpolate(gettext("%(lower)s–%(upper)s s"), {
          lower: formatNumber(estimate.lower, 3),
          upper: formatNumber(estimate.upper, 3),
        });
  return interpolate(gettext("%(value)s (%(bucket)s)"), { value: seconds(estimate.value), bucket });
}

function card(metric, label, value, detail) {
  return el(
    "div",
    { class: "card", "data-metric": metric },
    el("span", { class: "card-label", text: label }),
    el("strong", { class: "card-value", text: value }),
    detail ? el("span", { class: "card-detail", text: detail }) : null
  );
}

function renderCards(series) {
  const w = series.window;
  const last = series.points[series.points.length - 1] || {};
  const latency = (h) =>
    [
      interpolate(gettext("p50 %(value)s"), { value: percentileText(h.p50) }),
      interpolate(gettext("p90 %(value)s"), { value: percentileText(h.p90) }),
      interpolate(gettext("p99 %(value)s"), { value: percentileText(h.p99) }),
    ].join(" · ");
  cardsEl.replaceChildren(
    card(
      "hit_rate",
      gettext("Prefix-cache hit rate"),
      w.hit_rate === null ? "–" : formatPercent(w.hit_rate),
      interpolate(gettext("%(cached)s of %(prompt)s prompt tokens"), {
        cached: formatNumber(w.cached_prompt_tokens),
        prompt: formatNumber(w.prompt_tokens),
      })
    ),
    card("requests", gettext("Requests finished"), formatNumber(w.num_requests),
      interpolate(gettext("%(tokens)s tokens generated"), { tokens: formatNumber(w.generation_tokens) })),
    card("ttft", gettext("Time to first token"), w.ttft.p50 ? seconds(w.ttft.p50.value) : "–", latency(w.ttft)),
    card("itl", gettext("Inter-token latency"), w.itl.p50 ? seconds(w.itl.p50.value) : "–", latency(w.itl)),
    card("tokens_per_s", gettext("Tokens per second"),
      typeof last.tokens_per_s === "number" ? formatNumber(last.tokens_per_s, 1) : "–"),
    card("requests_now", gettext("Running / waiting"),
      typeof last.num_running === "number" ? `${formatNumber(last.num_running)} / ${formatNumber(last.num_waiting)}` : "–"),
    card("kv_usage", gettext("KV cache in use"), typeof last.kv_usage === "number" ? formatPercent(last.kv_usage) : "–")
  );
}

const pick = (points, read) => points.map((p) => [p.t, read(p)]);
const estimate = (h) => (h ? h.value : null);

function renderCharts(series) {
  const end = Date.now() / 1000;
  const points = series ? series.points : [];
  // The hour, or less while the history is younger: its points then spread across the chart.
  const earliest = Math.min(end - MIN_SPAN_S, ...points.map((p) => p.t), ...data.backends.map((b) => (b.points[0] || { t: end }).t));
  const start = Math.max(end - data.process.window_s, earliest);
  const empty = gettext("No data yet");
  const percentiles = (name) => [
    { label: "p50", points: pick(points, (p) => estimate(p[name].p50)) },
    { label: "p90", points: pick(points, (p) => estimate(p[name].p90)) },
    { label: "p99", points: pick(points, (p) => estimate(p[name].p99)) },
  ];
  const charts = {
    hit_rate: { series: [{ label: gettext("hit rate"), points: pick(points, (p) => p.hit_rate) }], yMax: 1, formatValue: formatPercent },
    ttft: { series: percentiles("ttft"), formatValue: (v) => formatNumber(v, 3) },
    itl: { series: percentiles("itl"), formatValue: (v) => formatNumber(v, 3) },
    tokens_per_s: { series: [{ label: gettext("tokens/s"), points: pick(points, (p) => p.tokens_per_s) }], formatValue: (v) => formatNumber(v) },
    requests: {
      series: [
        { label: gettext("running"), points: pick(points, (p) => p.num_running) },
        { label: gettext("waiting"), points: pick(points, (p) => p.num_waiting) },
      ],
      minTop: 4,
      formatValue: (v) => formatNumber(v),
    },
    kv_usage: { series: [{ label: gettext("KV in use"), points: pick(points, (p) => p.kv_usage) }], yMax: 1, formatValue: formatPercent },
    backends: {
      series: data.backends.flatMap((b) => [
        { label: b.backend, points: b.points.map((p) => [p.t, p.turns]) },
        // failed turns (errors, no replica free) get a line of their own only when there are any
        ...(b.points.some((p) => p.failed) ? [{ label: interpolate(gettext("%(backend)s failed"), { backend: b.backend }), points: b.points.map((p) => [p.t, p.failed]) }] : []),
      ]),
      minTop: 4,
      formatValue: (v) => formatNumber(v),
    },
  };
  for (const canvas of document.querySelectorAll("canvas[data-chart]")) {
    drawLineChart(canvas, { start, end, emptyText: empty, ...charts[canvas.dataset.chart] });
  }
}

function renderTabs() {
  const models = data.models.map((m) => m.model);
  if (!models.includes(chosenModel)) {
    const current = data.models.find((m) => m.is_current);
    chosenModel = current ? current.model : models[0] || null;
  }
  tabsEl.hidden = models.length < 2;
  tabsEl.replaceChildren(
    ...models.map((model) =>
      el("button", {
        type: "button",
        role: "tab",
        class: "model-tab",
        "data-model": model,
        "aria-selected": model === chosenModel ? "true" : "false",
        text: model,
      })
    )
  );
}

function renderBenchmark() {
  const table = document.getElementById("benchmark-table");
  const meta = document.getElementById("benchmark-meta");
  const chart = document.getElementById("benchmark-chart");
  const run = data.benchmark;
  if (!run) {
    meta.textContent = gettext("No benchmark run is recorded yet: run python -m bench.engine --table.");
    table.replaceChildren();
    chart.hidden = true;
    return;
  }
  meta.textContent = interpolate(gettext("Measured %(when)s by %(command)s."), { when: run.measured_at, command: run.command });
  const hasF1 = run.rows.some((row) => typeof row.answer_f1 === "number");
  const headings = [
    gettext("step"),
    gettext("TTFT p50 (s)"),
    gettext("single-request tok/s"),
    interpolate(gettext("throughput at %(concurrency)s (tok/s)"), { concurrency: run.workload.concurrency }),
    gettext("weights + peak KV (MB)"),
    gettext("quality (perplexity)"),
  ];
  if (hasF1) headings.push(gettext("answer F1"));
  const ratio = (value) => interpolate(gettext("%(value)s×"), { value: formatNumber(value, 2) });
  const rows = run.rows.map((row) => {
    const cells = [
      row.name,
      formatNumber(row.ttft_p50_s, 3),
      `${formatNumber(row.single_tok_s, 1)} (${ratio(row.single_tok_s_vs_baseline)})`,
      `${formatNumber(row.throughput_tok_s, 1)} (${ratio(row.throughput_vs_baseline)})`,
      `${formatNumber(row.weights_mb)} + ${formatNumber(row.kv_peak_mb)}`,
      `${formatNumber(row.perplexity, 2)} (${row.perplexity_change >= 0 ? "+" : ""}${formatPercent(row.perplexity_change)})`,
    ];
    if (hasF1) cells.push(typeof row.answer_f1 === "number" ? formatNumber(row.answer_f1, 3) : "–");
    return el("tr", {}, ...cells.map((cell, i) => el(i ? "td" : "th", { scope: i ? null : "row", text: cell })));
  });
  table.replaceChildren(
    el("thead", {}, el("tr", {}, ...headings.map((text) => el("th", { scope: "col", text })))),
    el("tbody", {}, ...rows)
  );
  chart.hidden = !run.chart;
  if (run.chart && !chart.getAttribute("src")) chart.src = config.chart_url;
}

function render() {
  if (!data) return;
  renderTabs();
  const series = data.models.find((m) => m.model === chosenModel) || null;
  if (series) renderCards(series);
  else cardsEl.replaceChildren(card("none", gettext("No model has been sampled yet"), "–"));
  renderCharts(series);
  renderBenchmark();
}

async function poll() {
  try {
    const response = await fetch(config.data_url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(String(response.status));
    data = await response.json();
    statusEl.textContent = data.process.is_sampling ? "" : gettext("This process runs no engine, so nothing is sampled here.");
    render();
  } catch (error) {
    statusEl.textContent = interpolate(gettext("Could not load the metrics (%(error)s); retrying."), { error: error.message });
  }
  const interval = data && data.process.sample_interval_s ? data.process.sample_interval_s * 1000 : MIN_POLL_MS;
  setTimeout(poll, Math.max(MIN_POLL_MS, interval));
}

tabsEl.addEventListener("click", (event) => {
  const tab = event.target.closest("button[data-model]");
  if (!tab) return;
  chosenModel = tab.dataset.model;
  render();
});
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(render, 150);
});
poll();
