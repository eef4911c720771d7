/*
 * The message list: user messages, assistant bubbles (dots until the first token, the answer,
 * its sources, stats and actions), errors shown in a bubble.
 *
 * User messages, source fields and errors are set with textContent only; answers go through
 * markdown.js (sanitised).
 */

import { copyText, flashCopied } from "./clipboard.js";
import { updateComposer } from "./composer.js";
import { SNIPPET_CHARS } from "./config.js";
import { el, icon, messagesEl } from "./dom.js";
import { feedbackButtons, feedbackNote } from "./feedback.js";
import { formatNumber, gettext, interpolate, ngettext } from "./i18n.js";
import { fillContent } from "./markdown.js";
import { bubbles, state } from "./state.js";
import { isNumber, safeUrl } from "./values.js";

export function userMessageEl(message) {
  return el(
    "div",
    {
      class: "message user",
      dataset: message.id ? { messageId: String(message.id) } : null,
    },
    el("div", { class: "content", text: message.content })
  );
}

export function assistantMessageEl(pending) {
  const body = el(
    "div",
    { class: "body" },
    pending
      ? el("div", { class: "typing-dots", role: "status", "aria-label": gettext("Assistant is typing") }, el("span"), el("span"), el("span"))
      : null,
    el("div", { class: "content" })
  );
  const node = el("div", { class: "message assistant", "aria-busy": pending ? "true" : null }, el("span", { class: "avatar", "aria-hidden": "true", text: "C" }), body);
  bubbles.set(node, { raw: "", sources: [], message: null });
  return node;
}

export function bodyOf(bubble) {
  return bubble.querySelector(".body");
}

export function removeDots(bubble) {
  const dots = bubble.querySelector(".typing-dots");
  if (dots) dots.remove();
}

/** The sources list under an answer; `collapsed` while the answer streams (the text being
 * written stays at the bottom of the view), open once it is done. */
export function renderSources(bubble, sources, collapsed) {
  const body = bodyOf(bubble);
  const old = body.querySelector(".sources");
  if (!sources || !sources.length) {
    if (old) old.remove();
    return;
  }
  const listId = "sources-" + Math.random().toString(36).slice(2, 9);
  if (old && old.dataset.userToggled) collapsed = old.querySelector(".source-list").hidden;
  const toggle = el(
    "button",
    { type: "button", class: "sources-toggle", "aria-expanded": String(!collapsed), "aria-controls": listId },
    icon("chevron"),
    el("span", { text: interpolate(gettext("Sources (%(count)s)"), { count: formatNumber(sources.length) }) })
  );
  const list = el("ol", { class: "source-list", id: listId, hidden: !!collapsed });
  sources.forEach((source, index) => list.append(sourceItem(source, index)));
  const box = el("div", { class: "sources" }, toggle, list);
  if (old && old.dataset.userToggled) box.dataset.userToggled = "1";
  if (old) old.replaceWith(box);
  else {
    const content = body.querySelector(".content");
    content.after(box);
  }
  requestAnimationFrame(() => {
    for (const snippet of list.querySelectorAll(".source-snippet")) {
      const text = snippet.querySelector(".snippet-text");
      const more = snippet.querySelector(".snippet-more");
      if (more && more.hidden && text.scrollHeight > text.clientHeight + 2) more.hidden = false;
    }
  });
}

function sourceItem(source, index) {
  const n = isNumber(source.n) ? source.n : index + 1;
  const href = safeUrl(source.url);
  const meta = [source.collection, source.page ? interpolate(gettext("page %(page)s"), { page: source.page }) : ""].filter(Boolean).join(" · ");
  const head = el(
    "div",
    { class: "source-head" },
    el("a", {
      class: "source-link",
      href: href || "#",
      target: "_blank",
      rel: "noopener",
      text: source.document_title || gettext("Untitled document"),
    }),
    meta ? el("span", { class: "source-meta", text: meta }) : null
  );
  const path = Array.isArray(source.heading_path) && source.heading_path.length
    ? el("div", { class: "source-path", text: source.heading_path.join(" › ") })
    : null;
  let snippet = null;
  const text = typeof source.snippet === "string" ? source.snippet.trim() : "";
  if (text) {
    snippet = el("div", { class: "source-snippet" });
    const short = text.length > SNIPPET_CHARS ? text.slice(0, SNIPPET_CHARS).replace(/\s+\S*$/, "") + "…" : text;
    // NOTE: CSS also clamps the short form to a few lines (phones); "Show more" shows it all.
    const shown = el("span", { class: "snippet-text clamped", text: short });
    const more = el("button", { type: "button", class: "link-button snippet-more", "aria-expanded": "false", text: gettext("Show more"), hidden: short === text });
    more.addEventListener("click", () => {
      const open = more.getAttribute("aria-expanded") === "true";
      shown.textContent = open ? short : text;
      shown.classList.toggle("clamped", open);
      more.textContent = open ? gettext("Show more") : gettext("Show less");
      more.setAttribute("aria-expanded", String(!open));
    });
    snippet.append(shown, more);
  }
  return el(
    "li",
    { class: "source-item", dataset: { n: String(n) } },
    el("span", { class: "source-n", text: String(n) }),
    el("div", { class: "source-body" }, head, path, snippet)
  );
}

function statsText(stats) {
  if (!stats) return "";
  const parts = [];
  if (isNumber(stats.ttft_s)) {
    parts.push(interpolate(gettext("TTFT %(seconds)s s"), { seconds: formatNumber(stats.ttft_s, 2) }));
  }
  if (isNumber(stats.tokens_per_s)) {
    parts.push(interpolate(gettext("%(rate)s tok/s"), { rate: formatNumber(stats.tokens_per_s, 1) }));
  }
  if (isNumber(stats.prompt_tokens)) {
    const counts = {
      prompt: formatNumber(stats.prompt_tokens),
      hit: formatNumber(stats.prompt_cache_hit_tokens),
      reused: formatNumber(stats.reused_tokens),
      miss: formatNumber(stats.prompt_cache_miss_tokens),
    };
    const split = isNumber(stats.prompt_cache_hit_tokens) && isNumber(stats.prompt_cache_miss_tokens);
    // NOTE: passages reused by the engine (chunk-KV reuse) are named only when there are some.
    parts.push(
      split && stats.reused_tokens > 0
        ? interpolate(
            gettext("%(prompt)s prompt tokens: %(hit)s cache hit, %(reused)s reused from passages, %(miss)s miss"),
            counts
          )
        : split
          ? interpolate(gettext("%(prompt)s prompt tokens: %(hit)s cache hit, %(miss)s miss"), counts)
          : interpolate(gettext("%(prompt)s prompt tokens"), counts)
    );
  }
  if (isNumber(stats.completion_tokens)) {
    const count = stats.completion_tokens;
    parts.push(interpolate(ngettext("%(count)s token", "%(count)s tokens", count), { count: formatNumber(count) }));
  }
  return parts.join(" · ");
}

/** finish_reason: [label, class]; the labels are read when shown, in the page's language. */
const FINISH_BADGES = {
  stopped: [() => gettext("stopped"), "neutral"],
  length: [() => gettext("length limit"), ""],
  abort: [() => gettext("interrupted"), ""],
  error: [() => gettext("error"), "danger"],
};

function renderFooter(bubble, message) {
  const body = bodyOf(bubble);
  const old = body.querySelector(".message-footer");
  if (old) old.remove();
  const footer = el("div", { class: "message-footer" });
  const stats = message ? statsText(message.stats) : "";
  if (stats) {
    const s = message.stats;
    const details = [
      s.model ? interpolate(gettext("Model: %(model)s"), { model: s.model }) : "",
      isNumber(s.total_s) ? interpolate(gettext("Total %(seconds)s s"), { seconds: formatNumber(s.total_s, 2) }) : "",
    ]
      .filter(Boolean)
      .join(" · ");
    footer.append(el("span", { class: "stats", text: stats, title: details || null }));
  }
  const model = message && message.stats && message.stats.model;
  // shown only while several models are on offer (model_picker.js marks the page)
  if (model) footer.append(el("span", { class: "answer-model", text: model }));
  const badge = message && FINISH_BADGES[message.finish_reason];
  if (badge) footer.append(el("span", { class: "badge finish-badge " + badge[1], text: badge[0]() }));
  const copy = el(
    "button",
    {
      type: "button",
      class: "action-button copy-button",
      "aria-label": gettext("Copy answer as markdown"),
      title: gettext("Copy answer (markdown)"),
    },
    icon("copy"),
    el("span", { class: "label", text: gettext("Copy") })
  );
  const saved = message && message.id && message.finish_reason !== "error";
  footer.append(el("div", { class: "message-actions" }, saved ? feedbackButtons(message) : null, copy));
  body.append(footer);
  const oldNote = body.querySelector(".feedback-note");
  if (oldNote) oldNote.remove();
  if (saved) body.append(feedbackNote(message));
}

/** Shows a saved assistant Message in `bubble`. */
export function fillAssistant(bubble, message, fallbackSources) {
  const shown = bubbles.get(bubble) || { raw: "", sources: [], message: null };
  shown.raw = typeof message.content === "string" ? message.content : shown.raw;
  shown.sources = Array.isArray(message.sources) && message.sources.length ? message.sources : fallbackSources || shown.sources;
  shown.message = message;
  bubbles.set(bubble, shown);
  if (message.id) bubble.dataset.messageId = String(message.id);
  removeDots(bubble);
  bubble.classList.remove("streaming");
  bubble.removeAttribute("aria-busy");
  const content = bubble.querySelector(".content");
  if (shown.raw) fillContent(content, shown.raw, shown.sources);
  else content.replaceChildren(el("p", { class: "hint", text: message.finish_reason === "stopped" ? gettext("Stopped before any text was written.") : gettext("No answer.") }));
  renderSources(bubble, shown.sources);
  renderFooter(bubble, message);
}

export function showBubbleError(bubble, text, actions) {
  removeDots(bubble);
  bubble.classList.remove("streaming");
  bubble.removeAttribute("aria-busy");
  const body = bodyOf(bubble);
  const old = body.querySelector(":scope > .error-message");
  if (old) old.remove();
  const box = el("div", { class: "error-message", role: "alert" }, el("p", { text }));
  if (actions && actions.length) box.append(el("div", { class: "error-actions" }, ...actions));
  const footer = body.querySelector(".message-footer");
  if (footer) footer.before(box);
  else body.append(box);
}

export function renderMessages(list) {
  const fragment = document.createDocumentFragment();
  for (const message of list) {
    if (message.role === "user") fragment.append(userMessageEl(message));
    else if (message.role === "assistant") {
      const bubble = assistantMessageEl(false);
      fillAssistant(bubble, message);
      fragment.append(bubble);
    }
  }
  messagesEl.replaceChildren(fragment);
}

export function lastAssistant() {
  const last = messagesEl.lastElementChild;
  return last && last.classList.contains("assistant") ? last : null;
}

/** Only the last saved answer gets a Regenerate button. */
export function updateRegenerateButtons() {
  for (const button of messagesEl.querySelectorAll(".regenerate-button")) button.remove();
  const last = lastAssistant();
  if (!last || !last.dataset.messageId || state.currentId === null) return;
  if (state.turn && state.turn.bubble === last) return;
  const actions = last.querySelector(".message-actions");
  if (!actions) return;
  actions.append(
    el(
      "button",
      {
        type: "button",
        class: "action-button regenerate-button",
        "aria-label": gettext("Regenerate answer"),
        title: gettext("Regenerate answer"),
      },
      icon("refresh"),
      el("span", { class: "label", text: gettext("Regenerate") })
    )
  );
  updateComposer();
}

/** The buttons inside answers (copy, copy code, sources toggle); `onRegenerate()` for Regenerate. */
export function setUpMessageActions({ onRegenerate }) {
  messagesEl.addEventListener("click", async (event) => {
    const target = event.target;
    const codeCopy = target.closest(".code-copy-button");
    if (codeCopy) {
      const code = codeCopy.parentElement.querySelector("code");
      flashCopied(codeCopy, await copyText(code ? code.textContent : ""));
      return;
    }
    const copy = target.closest(".copy-button");
    if (copy) {
      const bubble = copy.closest(".message.assistant");
      const shown = bubbles.get(bubble);
      flashCopied(copy, await copyText(shown ? shown.raw : ""));
      return;
    }
    if (target.closest(".regenerate-button")) {
      onRegenerate();
      return;
    }
    const toggle = target.closest(".sources-toggle");
    if (toggle) {
      const open = toggle.getAttribute("aria-expanded") === "true";
      toggle.setAttribute("aria-expanded", String(!open));
      const list = document.getElementById(toggle.getAttribute("aria-controls"));
      if (list) list.hidden = open;
      toggle.parentElement.dataset.userToggled = "1";
    }
  });

  // Hovering a citation highlights its source in the list below.
  messagesEl.addEventListener("mouseover", (event) => {
    const cite = event.target.closest("a.citation");
    if (!cite) return;
    const bubble = cite.closest(".message.assistant");
    const item = bubble && bubble.querySelector('.source-item[data-n="' + cite.dataset.n + '"]');
    if (!item) return;
    item.classList.remove("flash");
    void item.offsetWidth;
    item.classList.add("flash");
  });
}
