/*
 * Answers' markdown to sanitised HTML, with "[n]" citations linked to their sources. Uses the
 * vendored `marked` and `DOMPurify` (classic scripts that chat.html loads before the modules).
 *
 * Security: raw HTML written by the model is shown as text, and the result always goes through
 * DOMPurify before it reaches the DOM.
 */

import { el } from "./dom.js";
import { gettext, interpolate } from "./i18n.js";
import { isNumber, safeUrl } from "./values.js";

const markdown = createMarkdown();

/** Both libraries loaded (without them answers are shown as plain text). */
export function markdownLoaded() {
  return Boolean(markdown && window.DOMPurify);
}

function escapeHtml(text) {
  return String(text)
    .replace(/&/g, "&amp;")
    .replace(/</g, "&lt;")
    .replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;")
    .replace(/'/g, "&#39;");
}

function createMarkdown() {
  const lib = window.marked;
  if (!lib) return null;
  const renderer = {
    // Raw HTML written by the model is shown as text, not interpreted (DOMPurify would make it
    // safe anyway, but "explain the <b> tag" should show the tag).
    html(token) {
      const text = escapeHtml(typeof token === "string" ? token : token.text || token.raw || "");
      return token && token.block ? "<p>" + text + "</p>\n" : text;
    },
  };
  const settings = { gfm: true, breaks: false, async: false, renderer };
  if (typeof lib.Marked === "function") return new lib.Marked(settings);
  lib.use(settings);
  return lib;
}

if (window.DOMPurify && window.DOMPurify.addHook) {
  window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A" && node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
}

const PURIFY_CONFIG = {
  USE_PROFILES: { html: true },
  // NOTE: no images (a prompt-injected document could make the model leak data through an image
  // URL), no forms, no inline styles.
  FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select", "option", "iframe", "video", "audio", "picture", "source"],
  FORBID_ATTR: ["style", "id", "name", "srcset"],
};

/** Markdown → sanitised HTML string. Never returns unsanitised HTML. */
function renderMarkdown(raw) {
  if (!window.DOMPurify) return escapeHtml(raw).replace(/\n/g, "<br>");
  let html;
  try {
    html = markdown ? markdown.parse(raw) : escapeHtml(raw);
  } catch (error) {
    html = "<pre><code>" + escapeHtml(raw) + "</code></pre>";
  }
  return window.DOMPurify.sanitize(html, PURIFY_CONFIG);
}

const CITATION = /\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]/g;

/** Turns "[n]" in text nodes (not in code or links) into links to sources[n-1]. */
function linkCitations(root, sources) {
  if (!sources || !sources.length) return;
  const byN = new Map();
  sources.forEach((source, index) => byN.set(isNumber(source.n) ? source.n : index + 1, source));
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
    acceptNode(node) {
      if (!node.nodeValue.includes("[")) return NodeFilter.FILTER_SKIP;
      return node.parentElement.closest("pre, code, a") ? NodeFilter.FILTER_SKIP : NodeFilter.FILTER_ACCEPT;
    },
  });
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  for (const node of nodes) {
    const text = node.nodeValue;
    CITATION.lastIndex = 0;
    let match;
    let last = 0;
    let changed = false;
    const fragment = document.createDocumentFragment();
    while ((match = CITATION.exec(text))) {
      const numbers = match[1].split(",").map((n) => parseInt(n, 10));
      if (!numbers.every((n) => byN.has(n))) continue;
      changed = true;
      fragment.append(text.slice(last, match.index));
      const group = numbers.length > 1 ? el("span", { class: "citation-group" }) : fragment;
      numbers.forEach((n) => group.append(citationLink(n, byN.get(n))));
      if (group !== fragment) fragment.append(group);
      last = match.index + match[0].length;
    }
    if (!changed) continue;
    fragment.append(text.slice(last));
    node.replaceWith(fragment);
  }
}

function citationLink(n, source) {
  const href = safeUrl(source.url);
  const page = source.page ? interpolate(gettext("page %(page)s"), { page: source.page }) : "";
  const title = [source.document_title, page].filter(Boolean).join(", ");
  return el("a", {
    class: "citation",
    href: href || "#",
    target: "_blank",
    rel: "noopener",
    title: title || interpolate(gettext("Source %(n)s"), { n }),
    dataset: { n: String(n) },
    text: "[" + n + "]",
  });
}

function decorateCodeBlocks(root) {
  for (const code of root.querySelectorAll("pre > code")) {
    const pre = code.parentElement;
    const lang = /(?:^|\s)language-([\w+#.-]{1,20})/.exec(code.className);
    if (lang) pre.dataset.lang = lang[1];
    pre.append(el("button", { type: "button", class: "code-copy-button", "aria-label": gettext("Copy code"), text: gettext("Copy") }));
  }
}

/** Shows `raw` markdown in `contentEl`: sanitised, citations linked, code blocks with Copy. */
export function fillContent(contentEl, raw, sources) {
  contentEl.innerHTML = renderMarkdown(raw); // sanitised by renderMarkdown
  linkCitations(contentEl, sources);
  decorateCodeBlocks(contentEl);
}
