/*
 * A cited passage in place: clicking "[n]" or a source opens its document beside the answer, in
 * a side panel scrolled to the cited span, which is in a <mark>. On narrow screens (phones) the
 * same click opens the document's page instead, marked the same way; a click with a modifier
 * key (new tab, new window) is left to the browser.
 *
 * The panel reads GET /documents/<id>/text/?chunk=<id> (frontend/documents.py), which answers
 * only for documents whose collection the user may read. Security: the document's text is set
 * with textContent only, never as HTML.
 *
 * Accessibility: the panel is a labelled region; opening it moves focus to its heading, Escape
 * or the close button closes it and gives focus back to the link that opened it.
 */

import { el, icon, messagesEl } from "./dom.js";
import { gettext, interpolate } from "./i18n.js";
import { state } from "./state.js";
import { isNumber } from "./values.js";

const NARROW = window.matchMedia("(max-width: 700px)");
const DOCUMENT_PATH = /^\/documents\/(\d+)\/$/;
const CHUNK_FRAGMENT = /^#chunk-(\d+)$/;

let panel = null;
let parts = null;
let returnFocusTo = null;
let requestNumber = 0; // a later click wins over a slower earlier response

/** {documentId, chunkId} of a link to a cited passage, or null for any other link. */
function citedPassage(link) {
  const url = new URL(link.getAttribute("href") || "", window.location.href);
  const path = DOCUMENT_PATH.exec(url.pathname);
  if (url.origin !== window.location.origin || !path) return null;
  const fragment = CHUNK_FRAGMENT.exec(url.hash);
  const chunk = url.searchParams.get("chunk") || (fragment && fragment[1]);
  return { documentId: Number(path[1]), chunkId: chunk && /^\d+$/.test(chunk) ? Number(chunk) : null };
}

/** The document page at the passage; its Back link returns to this conversation. */
function pageUrl(passage) {
  const query = new URLSearchParams();
  if (passage.chunkId !== null) query.set("chunk", String(passage.chunkId));
  if (isNumber(state.currentId)) query.set("conversation", String(state.currentId));
  const hash = passage.chunkId !== null ? "#chunk-" + passage.chunkId : "";
  return "/documents/" + passage.documentId + "/?" + query.toString() + hash;
}

function build() {
  const title = el("h2", { class: "source-panel-title", id: "source-panel-title", tabindex: "-1" });
  const close = el("button", { type: "button", class: "icon-button source-panel-close", id: "source-panel-close", "aria-label": gettext("Close the source") }, icon("close"));
  const meta = el("p", { class: "source-panel-meta", id: "source-panel-meta" });
  const page = el("a", { class: "source-panel-page-link", id: "source-panel-page-link", href: "#", target: "_blank", rel: "noopener", text: gettext("Open as a page") });
  const status = el("p", { class: "source-panel-status", id: "source-panel-status", role: "status" });
  const body = el("div", { class: "source-panel-body cited-text", id: "source-panel-body" });
  panel = el(
    "aside",
    { class: "source-panel", id: "source-panel", role: "region", "aria-labelledby": "source-panel-title", hidden: true },
    el("header", { class: "source-panel-header" }, el("div", { class: "source-panel-heading" }, title, meta), close),
    el("div", { class: "source-panel-links" }, page),
    status,
    body
  );
  parts = { title, meta, page, status, body };
  close.addEventListener("click", closePanel);
  panel.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.isComposing) return;
    // NOTE: not on to the page's Escape (composer.js), which would stop a running answer.
    event.stopPropagation();
    closePanel();
  });
  document.getElementById("app").append(panel);
}

function openPanel(passage, link) {
  if (!panel) build();
  returnFocusTo = link;
  const number = ++requestNumber;
  parts.title.textContent = link.title || link.textContent || gettext("Source");
  parts.meta.textContent = "";
  parts.page.href = pageUrl(passage);
  parts.body.replaceChildren();
  parts.status.textContent = gettext("Loading the document…");
  panel.setAttribute("aria-busy", "true");
  panel.hidden = false;
  document.getElementById("app").classList.add("source-panel-open");
  parts.title.focus();
  loadDocument(passage, number);
}

async function loadDocument(passage, number) {
  let data = null;
  let failure = gettext("The document could not be loaded. Try again.");
  try {
    const query = passage.chunkId !== null ? "?chunk=" + passage.chunkId : "";
    const response = await fetch("/documents/" + passage.documentId + "/text/" + query, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (response.ok) data = await response.json();
    else if (response.status === 404) failure = gettext("This document is not available to you, or no longer exists.");
  } catch (error) {
    data = null;
  }
  if (number !== requestNumber || panel.hidden) return;
  panel.removeAttribute("aria-busy");
  if (!data) {
    parts.status.textContent = failure;
    return;
  }
  showDocument(data, passage);
}

function showDocument(data, passage) {
  parts.title.textContent = data.title || gettext("Untitled document");
  const cited = data.cited;
  const page = cited && isNumber(cited.page) ? interpolate(gettext("Cited passage on page %(page)s"), { page: cited.page }) : "";
  parts.meta.textContent = [data.collection, page].filter(Boolean).join(" · ");
  parts.status.textContent = passage.chunkId !== null && !cited
    ? gettext("The cited passage is no longer in this document (it was ingested again); the text below is the current one.")
    : "";
  const blocks = Array.isArray(data.blocks) ? data.blocks : [];
  for (const block of blocks) parts.body.append(blockElement(block));
  if (!blocks.length) parts.body.append(el("p", { class: "empty-note", text: gettext("This document has no text yet.") }));
  const mark = parts.body.querySelector("mark.cited-span");
  if (mark) mark.scrollIntoView({ block: "center" });
}

function blockElement(block) {
  const labels = [];
  if (isNumber(block.page)) labels.push(el("span", { class: "block-page", text: interpolate(gettext("page %(page)s"), { page: block.page }) }));
  if (Array.isArray(block.heading_path) && block.heading_path.length) {
    labels.push(el("span", { class: "block-headings", text: block.heading_path.join(" › ") }));
  }
  const text = el("div", { class: "block-text" });
  for (const run of Array.isArray(block.runs) ? block.runs : []) {
    const words = (run.pieces || []).map((piece) => String(piece.text || "")).join("");
    text.append(run.cited ? el("mark", { class: "cited-span", text: words }) : document.createTextNode(words));
  }
  return el("section", { class: "text-block" }, labels.length ? el("p", { class: "block-meta" }, ...labels) : null, text);
}

function closePanel() {
  if (!panel || panel.hidden) return;
  requestNumber++;
  panel.hidden = true;
  document.getElementById("app").classList.remove("source-panel-open");
  if (returnFocusTo && returnFocusTo.isConnected) returnFocusTo.focus();
  returnFocusTo = null;
}

export function setUpSourcePanel() {
  messagesEl.addEventListener("click", (event) => {
    const link = event.target.closest("a.citation, a.source-link");
    if (!link || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
    const passage = citedPassage(link);
    if (!passage) return;
    event.preventDefault();
    if (NARROW.matches) window.location.assign(pageUrl(passage));
    else openPanel(passage, link);
  });
  NARROW.addEventListener("change", () => {
    if (NARROW.matches) closePanel();
  });
}
