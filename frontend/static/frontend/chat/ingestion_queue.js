/*
 * The ingestion queue (staff): every document's state and progress in one list (a dialog opened
 * from the upload panel), with Cancel for queued or running ingestions and Retry for failed or
 * cancelled ones. Running documents are followed live on their progress sockets; while anything
 * is queued or running the list is also polled (GET /chat/api/documents/queue/), which finds
 * documents that start, and stands in for a socket that cannot connect.
 */

import { api } from "./api.js";
import { FINISHED_STATUSES, followDocument } from "./document_progress.js";
import { $, el, icon } from "./dom.js";
import { formatPercent, gettext, interpolate, ngettext } from "./i18n.js";
import { statusLabel } from "./upload.js";

const POLL_MS = 2000;
// Sockets open at once; the rest of the running documents are polled.
const MAX_FOLLOWED = 4;
const dialog = $("#ingestion-queue");
const list = $("#queue-list");
const summary = $("#queue-summary");
const empty = $("#queue-empty");
const errorBox = $("#queue-error");
const items = new Map(); // document id -> its <li>
const followed = new Map(); // document id -> followDocument handle
let pollTimer = null;

function isActive(status) {
  return status === "queued" || status === "processing";
}

function showError(message) {
  errorBox.hidden = !message;
  errorBox.textContent = message || "";
}

function newItem(doc) {
  const cancel = el("button", { type: "button", class: "button small queue-cancel", text: gettext("Cancel"), onclick: () => act(doc.id, "cancel") });
  const retry = el("button", { type: "button", class: "button small queue-retry", text: gettext("Retry"), onclick: () => act(doc.id, "retry") });
  const track = el("div", { class: "progress-track", role: "progressbar", "aria-label": interpolate(gettext("Progress of %(name)s"), { name: doc.title }), "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": "0" }, el("div", { class: "progress-bar" }));
  return el(
    "li",
    { class: "queue-item", dataset: { documentId: String(doc.id) } },
    el("div", { class: "queue-heading" }, el("span", { class: "queue-title", text: doc.title, title: doc.title }), el("span", { class: "queue-collection", text: doc.collection ? doc.collection.name : "" })),
    track,
    el("div", { class: "queue-footer" }, el("span", { class: "queue-status" }), cancel, retry)
  );
}

function update(item, row) {
  item.dataset.status = row.status;
  const pct = row.status === "ready" ? 100 : Math.max(0, Math.min(100, Math.round(row.progress || 0)));
  item.querySelector(".progress-bar").style.width = pct + "%";
  item.querySelector(".progress-track").setAttribute("aria-valuenow", String(pct));
  let text = statusLabel(row.status);
  if (row.status === "processing") text += " " + formatPercent(pct / 100);
  if (row.status === "failed" && row.error) text = interpolate(gettext("Failed: %(error)s"), { error: row.error });
  item.querySelector(".queue-status").textContent = text;
  item.querySelector(".queue-cancel").hidden = !isActive(row.status);
  item.querySelector(".queue-retry").hidden = !(row.status === "failed" || row.status === "cancelled");
  const title = item.querySelector(".queue-title");
  if (row.status === "ready" && title.tagName !== "A") {
    title.replaceWith(el("a", { class: "queue-title", href: "/documents/" + item.dataset.documentId + "/", target: "_blank", rel: "noopener", text: title.textContent, title: title.textContent }));
  }
}

function showSummary(docs) {
  const count = (status) => docs.filter((doc) => doc.status === status).length;
  const parts = [
    [count("processing"), ngettext("%(count)s running", "%(count)s running", count("processing"))],
    [count("queued"), ngettext("%(count)s queued", "%(count)s queued", count("queued"))],
    [count("failed"), ngettext("%(count)s failed", "%(count)s failed", count("failed"))],
  ];
  summary.textContent = parts.filter(([n]) => n).map(([n, format]) => interpolate(format, { count: n })).join(" · ");
}

function follow(id) {
  if (followed.has(id) || followed.size >= MAX_FOLLOWED) return;
  const handle = followDocument(id, {
    onRow(row) {
      const item = items.get(id);
      if (item) update(item, row);
      if (FINISHED_STATUSES.has(row.status)) {
        followed.delete(id);
        schedule(0);
      }
    },
    onStop() {
      followed.delete(id); // polling carries on
    },
  });
  followed.set(id, handle);
}

function render(docs) {
  const ids = new Set(docs.map((doc) => doc.id));
  for (const id of items.keys()) if (!ids.has(id)) items.delete(id);
  list.replaceChildren(
    ...docs.map((doc) => {
      const item = items.get(doc.id) || newItem(doc);
      items.set(doc.id, item);
      update(item, doc);
      return item;
    })
  );
  empty.hidden = docs.length > 0;
  showSummary(docs);
  for (const doc of docs) if (doc.status === "processing") follow(doc.id);
}

function schedule(delay) {
  clearTimeout(pollTimer);
  pollTimer = dialog.open ? setTimeout(refresh, delay) : null;
}

/** Loads the list again (now, if the queue is open). */
export async function refresh() {
  if (!dialog || !dialog.open) return;
  let docs;
  try {
    docs = (await api("GET", "documents/queue/")).documents || [];
    showError("");
  } catch (error) {
    showError(error.message);
    schedule(POLL_MS * 2);
    return;
  }
  render(docs);
  if (docs.some((doc) => isActive(doc.status))) schedule(POLL_MS);
}

async function act(id, action) {
  showError("");
  const item = items.get(id);
  if (action === "retry" && item) update(item, { status: "queued", progress: 0, error: "" });
  // NOTE: with tasks run in-process a retry's request lasts as long as the ingestion; the list
  // does not wait for it, it polls.
  const request = api("POST", "documents/" + id + "/" + action + "/");
  schedule(action === "retry" ? 300 : POLL_MS);
  try {
    const answer = await request;
    if (item && answer && answer.document) update(item, answer.document);
  } catch (error) {
    showError(error.message);
  }
  schedule(0);
}

function close() {
  clearTimeout(pollTimer);
  for (const handle of followed.values()) handle.close();
  followed.clear();
}

/** Opens the queue (or refreshes it if open). */
export function openQueue() {
  if (!dialog) return;
  if (!dialog.open) dialog.showModal();
  refresh();
}

export function setUpIngestionQueue() {
  if (!dialog) return;
  $("#queue-open").addEventListener("click", openQueue);
  const closeButton = $("#queue-close");
  closeButton.append(icon("close"));
  closeButton.addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", close);
}
