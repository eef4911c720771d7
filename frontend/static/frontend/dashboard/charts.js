/*
 * Line charts on <canvas>, drawn by hand (no chart library): time on x over a fixed span, one
 * line per series, a few grid lines with labels, a legend. Gaps (null values) break a line.
 * The canvas is sized to its box at the device's pixel ratio, so redraw it after a resize.
 */

import { LANGUAGE } from "../chat/i18n.js";

export const PALETTE = ["#3b5bdb", "#e8590c", "#2b8a3e", "#ae3ec9"];
const HEIGHT_PX = 180;
const PAD = { left: 52, right: 12, top: 26, bottom: 22 };
const NUM_GRID_LINES = 4;

const timeFormat = (() => {
  try {
    return new Intl.DateTimeFormat(LANGUAGE, { hour: "2-digit", minute: "2-digit" });
  } catch (error) {
    return new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
  }
})();

function cssColor(canvas, name, fallback) {
  const value = getComputedStyle(canvas).getPropertyValue(name).trim();
  return value || fallback;
}

/** A "nice" upper bound for the y axis (1, 2, 2.5 or 5 times a power of ten). */
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(200, canvas.clientWidth || canvas.parentElement.clientWidth);
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(HEIGHT_PX * ratio);
  canvas.style.height = HEIGHT_PX + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, HEIGHT_PX);
  return { ctx, width, height: HEIGHT_PX };
}

/**
 * Draws `series` ([{label, points: [[unix seconds, value or null], ...]}]) from `start` to `end`
 * (unix seconds). `formatValue` labels the y axis; `yMax` fixes its top (else from the data,
 * at least `minTop`: counts get whole-number grid lines); `formatTime` labels the x axis
 * (default: hours and minutes).
 * Sets canvas.dataset.points to the number of points drawn (the browser tests read it).
 */
export function drawLineChart(canvas, { series, start, end, formatValue, yMax, minTop, emptyText, formatTime }) {
  const { ctx, width, height } = prepare(canvas);
  const text = cssColor(canvas, "--muted", "#6b6b76");
  const grid = cssColor(canvas, "--border", "#e3e3e8");
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const values = series.flatMap((s) => s.points.map((p) => p[1])).filter((v) => typeof v === "number");
  const top = yMax || niceMax(Math.max(minTop || 0, ...values));
  const x = (t) => PAD.left + ((t - start) / Math.max(1, end - start)) * plotW;
  const y = (v) => PAD.top + plotH - (Math.min(v, top) / top) * plotH;

  ctx.font = "11px system-ui, sans-serif";
  ctx.lineWidth = 1;
  ctx.strokeStyle = grid;
  ctx.fillStyle = text;
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  for (let i = 0; i <= NUM_GRID_LINES; i++) {
    const value = (top * i) / NUM_GRID_LINES;
    const gy = Math.round(y(value)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(PAD.left, gy);
    ctx.lineTo(width - PAD.right, gy);
    ctx.stroke();
    ctx.fillText(formatValue(value), PAD.left - 6, gy);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const numTicks = width < 420 ? 3 : 5;
  for (let i = 0; i < numTicks; i++) {
    const t = start + ((end - start) * i) / (numTicks - 1);
    const label = formatTime ? formatTime(t) : timeFormat.format(new Date(t * 1000));
    ctx.textAlign = i === 0 ? "left" : i === numTicks - 1 ? "right" : "center";
    ctx.fillText(label, x(t), height - PAD.bottom + 6);
  }

  let drawn = 0;
  series.forEach((s, index) => {
    const color = s.color || PALETTE[index % PALETTE.length];
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let open = false;
    for (const [t, v] of s.points) {
      if (typeof v !== "number") {
        open = false;
        continue;
      }
      if (open) ctx.lineTo(x(t), y(v));
      else ctx.moveTo(x(t), y(v));
      open = true;
      drawn += 1;
    }
    ctx.stroke();
    // a lone point between gaps would draw nothing as a line: mark every point as a dot too
    for (const [t, v] of s.points) {
      if (typeof v !== "number") continue;
      ctx.beginPath();
      ctx.arc(x(t), y(v), 2, 0, 2 * Math.PI);
      ctx.fill();
    }
  });

  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  let lx = PAD.left;
  series.forEach((s, index) => {
    const color = s.color || PALETTE[index % PALETTE.length];
    ctx.fillStyle = color;
    ctx.fillRect(lx, 8, 10, 10);
    ctx.fillStyle = text;
    ctx.fillText(s.label, lx + 14, 13);
    lx += 22 + ctx.measureText(s.label).width;
  });
  if (!drawn && emptyText) {
    ctx.fillStyle = text;
    ctx.textAlign = "center";
    ctx.fillText(emptyText, PAD.left + plotW / 2, PAD.top + plotH / 2);
  }
  canvas.dataset.points = String(drawn);
}
