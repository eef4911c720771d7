/*
 * Cachet chat UI: plain JavaScript, no framework, no build step. Talks to the server as described
 * in docs/chat-protocol.md (WebSocket /ws/chat/ for turns, JSON endpoints under /chat/api/).
 * Needs the vendored `marked` and `DOMPurify` (static/frontend/vendor/) loaded before it.
 *
 * Security: answers are markdown rendered with marked, raw HTML in them is shown as text, and the
 * result always goes through DOMPurify before it reaches the DOM; user messages, titles, source
 * fields and errors are set with textContent only.
 *
 * Stable hooks for the browser tests (keep these names):
 *   #message-input                 the composer textarea
 *   #send-button, #stop-button     send (hidden while a turn runs) / stop (shown only then)
 *   #new-chat-button               starts a new chat
 *   #conversation-list             sidebar list: li[data-conversation-id] > a.conversation-link
 *                                  (the current one has class "active"); .rename-button, .delete-button
 *   #messages                      the message list (aria-live="polite")
 *   .message.user                  a user message (plain text in .content)
 *   .message.assistant             an answer; data-message-id once saved
 *     .typing-dots                 present only until the first token
 *     .content                     the rendered, sanitised markdown (a.citation links inside)
 *     .sources a.source-link       the sources list under the answer
 *     .stats                       stats line of a finished answer
 *     .regenerate-button           only on the last answer
 *     .copy-button                 copies the answer's raw markdown (code blocks: .code-copy-button)
 *     .finish-badge                "stopped" / "length limit" / "interrupted" / "error"
 *     .retry-button                in an error that can be retried
 *   .error-message                 an error shown inline (in a bubble) or as a toast
 *   #connection-status             data-state = connecting | reconnecting | open | closed
 *   #collection-picker             collections for a new chat (shown only for a new chat)
 *   #profile-select                profile for a new chat (shown if there is more than one)
 *   #upload-form, .upload-progress staff upload and its live progress items
 */
(function () {
  "use strict";

  // ---------------------------------------------------------------- configuration

  const config = Object.assign(
    { conversation_id: null, ws_path: "/ws/chat/", api_root: "/chat/api/", logout_url: "/logout/" },
    readJson("chat-config") || {}
  );
  if (!config.api_root.endsWith("/")) config.api_root += "/";

  const RECONNECT_MIN_MS = 500;
  const RECONNECT_MAX_MS = 10000;
  const PING_INTERVAL_MS = 30000;
  const SNIPPET_CHARS = 300;
  const AT_BOTTOM_PX = 80;
  const PHONE = window.matchMedia("(max-width: 640px)");

  // ---------------------------------------------------------------- elements

  const $ = (selector, root) => (root || document).querySelector(selector);
  const app = $("#app");
  const sidebar = $("#sidebar");
  const backdrop = $("#backdrop");
  const menuButton = $("#menu-button");
  const conversationList = $("#conversation-list");
  const conversationEmpty = $("#conversation-empty");
  const newChatButton = $("#new-chat-button");
  const titleEl = $("#conversation-title");
  const metaEl = $("#conversation-meta");
  const statusEl = $("#connection-status");
  const scroller = $("#scroller");
  const messagesEl = $("#messages");
  const newChatPanel = $("#new-chat-panel");
  const collectionOptions = $("#collection-options");
  const profilePicker = $("#profile-picker");
  const profileSelect = $("#profile-select");
  const jumpButton = $("#jump-button");
  const composer = $("#composer");
  const input = $("#message-input");
  const sendButton = $("#send-button");
  const stopButton = $("#stop-button");
  const composerHint = $("#composer-hint");
  const charCounter = $("#char-counter");
  const toasts = $("#toasts");
  const logoutForm = $("#logout-form");
  const uploadPanel = $("#upload-panel");
  const uploadForm = $("#upload-form");
  const uploadFile = $("#upload-file");
  const uploadCollection = $("#upload-collection");
  const uploadHint = $("#upload-hint");
  const uploadButton = $("#upload-button");
  const uploadError = $("#upload-error");
  const uploadList = $("#upload-list");
  const DEFAULT_HINT = composerHint.textContent;

  // ---------------------------------------------------------------- state

  let options = null; // GET /chat/api/options/
  let maxChars = Infinity;
  let conversations = []; // [{id, title, updated_at}], newest first
  let currentId = null; // the conversation shown, null for a new chat
  let viewToken = 0; // bumped whenever the view changes; stale loads check it
  let renamingId = null;
  let turn = null; // the running turn, see startTurn()
  let ws = null;
  let wsOpen = false;
  let reconnectAttempt = 0;
  let reconnectTimer = null;
  let everConnected = false;
  let reloadAfterReconnect = null; // {conversationId} when a turn was cut by a disconnect
  let stickToBottom = true;
  let unloading = false;
  const bubbleState = new WeakMap(); // assistant element -> {raw, sources, message}

  // ---------------------------------------------------------------- small helpers

  function readJson(id) {
    const node = document.getElementById(id);
    if (!node) return null;
    try {
      return JSON.parse(node.textContent);
    } catch (error) {
      return null;
    }
  }

  function getCookie(name) {
    const prefix = name + "=";
    for (const part of document.cookie ? document.cookie.split(";") : []) {
      const item = part.trim();
      if (item.startsWith(prefix)) return decodeURIComponent(item.slice(prefix.length));
    }
    return "";
  }

  /** el("div", {class: "x", text: "hi", dataset: {a: 1}, onclick: fn, "aria-label": "…"}, ...children) */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
      else if (value === true) node.setAttribute(key, "");
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child);
    }
    return node;
  }

  const ICONS = {
    copy: ["M9 9h10v10H9z", "M5 15V5h10"],
    check: ["M5 12l5 5 9-10"],
    refresh: ["M20 11a8 8 0 1 0-2.3 5.7", "M20 4v7h-7"],
    pencil: ["M4 20h4L19 9l-4-4L4 16z", "M13.5 6.5l4 4"],
    trash: ["M4 7h16", "M9 7V4h6v3", "M6 7l1 13h10l1-13"],
    chevron: ["M6 9l6 6 6-6"],
    close: ["M6 6l12 12", "M18 6L6 18"],
  };

  function icon(name) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("aria-hidden", "true");
    for (const d of ICONS[name]) {
      const path = document.createElementNS(ns, "path");
      path.setAttribute("d", d);
      svg.append(path);
    }
    return svg;
  }

  function isNumber(value) {
    return typeof value === "number" && Number.isFinite(value);
  }

  /** Only same-origin paths and http(s) URLs become links. */
  function safeUrl(url) {
    if (typeof url !== "string") return null;
    if (url.startsWith("/") && !url.startsWith("//")) return url;
    if (/^https?:\/\//i.test(url)) return url;
    return null;
  }

  function wsUrl(path) {
    return (window.location.protocol === "https:" ? "wss://" : "ws://") + window.location.host + path;
  }

  function loginUrl() {
    return "/login/?next=" + encodeURIComponent(window.location.pathname);
  }

  function isTypingTarget(node) {
    return node && (node.tagName === "TEXTAREA" || node.tagName === "INPUT" || node.isContentEditable);
  }

  // ---------------------------------------------------------------- JSON API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function errorFrom(response) {
    let code = "http_" + response.status;
    let message = "";
    try {
      const data = await response.json();
      if (data && data.error) {
        code = data.error.code || code;
        message = data.error.message || "";
      }
    } catch (error) {
      /* not JSON: a proxy page or a server error */
    }
    if (!message) {
      message =
        response.status === 413
          ? "The file is too large."
          : response.status >= 500
            ? "The server had a problem (" + response.status + "). Please try again."
            : "The request failed (" + response.status + ").";
    }
    return new ApiError(response.status, code, message);
  }

  function goToLogin() {
    unloading = true;
    window.location.assign(loginUrl());
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const init = { method, headers, credentials: "same-origin" };
    if (method !== "GET" && method !== "HEAD") headers["X-CSRFToken"] = getCookie("csrftoken");
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(config.api_root + path, init);
    } catch (error) {
      throw new ApiError(0, "network", "Could not reach the server. Check your connection.");
    }
    if (response.redirected && new URL(response.url).pathname.startsWith("/login")) {
      goToLogin();
      throw new ApiError(401, "unauthenticated", "Your session has ended; please log in again.");
    }
    if (response.status === 401) {
      goToLogin();
      throw new ApiError(401, "unauthenticated", "Your session has ended; please log in again.");
    }
    if (!response.ok) throw await errorFrom(response);
    if (response.status === 204) return null;
    try {
      return await response.json();
    } catch (error) {
      throw new ApiError(response.status, "bad_response", "The server sent an unreadable answer.");
    }
  }

  // ---------------------------------------------------------------- toasts

  function toast(message, kind) {
    const close = el("button", { type: "button", class: "icon-button", "aria-label": "Dismiss" }, icon("close"));
    const node = el(
      "div",
      { class: "toast " + (kind === "info" ? "info" : "error-message"), role: kind === "info" ? "status" : "alert" },
      el("p", { text: message }),
      close
    );
    const dismiss = () => node.remove();
    close.addEventListener("click", dismiss);
    toasts.append(node);
    while (toasts.children.length > 3) toasts.firstElementChild.remove();
    setTimeout(dismiss, kind === "info" ? 3500 : 8000);
    return node;
  }

  // ---------------------------------------------------------------- copy to clipboard

  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(text);
        return true;
      } catch (error) {
        /* fall back below */
      }
    }
    const focused = document.activeElement;
    const area = el("textarea", { readonly: true, "aria-hidden": "true" });
    area.value = text;
    area.style.cssText = "position:fixed;top:0;left:0;width:1px;height:1px;opacity:0;";
    document.body.append(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (error) {
      ok = false;
    }
    area.remove();
    if (focused && typeof focused.focus === "function") focused.focus({ preventScroll: true });
    return ok;
  }

  function flashCopied(button, ok) {
    const label = button.querySelector(".label") || button;
    if (!button.dataset.label) button.dataset.label = label.textContent;
    label.textContent = ok ? "Copied" : "Copy failed";
    button.classList.toggle("copied", ok);
    clearTimeout(button._copyTimer);
    button._copyTimer = setTimeout(() => {
      label.textContent = button.dataset.label;
      button.classList.remove("copied");
    }, 1600);
  }

  // ---------------------------------------------------------------- markdown

  const markdown = createMarkdown();

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
    const title = [source.document_title, source.page ? "page " + source.page : ""].filter(Boolean).join(", ");
    return el("a", {
      class: "citation",
      href: href || "#",
      target: "_blank",
      rel: "noopener",
      title: title || "Source " + n,
      dataset: { n: String(n) },
      text: "[" + n + "]",
    });
  }

  function decorateCodeBlocks(root) {
    for (const code of root.querySelectorAll("pre > code")) {
      const pre = code.parentElement;
      const lang = /(?:^|\s)language-([\w+#.-]{1,20})/.exec(code.className);
      if (lang) pre.dataset.lang = lang[1];
      pre.append(el("button", { type: "button", class: "code-copy-button", "aria-label": "Copy code", text: "Copy" }));
    }
  }

  function fillContent(contentEl, raw, sources) {
    contentEl.innerHTML = renderMarkdown(raw); // sanitised by renderMarkdown
    linkCitations(contentEl, sources);
    decorateCodeBlocks(contentEl);
  }

  // ---------------------------------------------------------------- messages

  function userMessageEl(message) {
    return el(
      "div",
      {
        class: "message user",
        dataset: message.id ? { messageId: String(message.id) } : null,
      },
      el("div", { class: "content", text: message.content })
    );
  }

  function assistantMessageEl(pending) {
    const body = el(
      "div",
      { class: "body" },
      pending
        ? el("div", { class: "typing-dots", role: "status", "aria-label": "Assistant is typing" }, el("span"), el("span"), el("span"))
        : null,
      el("div", { class: "content" })
    );
    const node = el("div", { class: "message assistant", "aria-busy": pending ? "true" : null }, el("span", { class: "avatar", "aria-hidden": "true", text: "C" }), body);
    bubbleState.set(node, { raw: "", sources: [], message: null });
    return node;
  }

  function bodyOf(bubble) {
    return bubble.querySelector(".body");
  }

  function removeDots(bubble) {
    const dots = bubble.querySelector(".typing-dots");
    if (dots) dots.remove();
  }

  /** The sources list under an answer; `collapsed` while the answer streams (the text being
   * written stays at the bottom of the view), open once it is done. */
  function renderSources(bubble, sources, collapsed) {
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
      el("span", { text: "Sources (" + sources.length + ")" })
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
    const meta = [source.collection, source.page ? "page " + source.page : ""].filter(Boolean).join(" · ");
    const head = el(
      "div",
      { class: "source-head" },
      el("a", {
        class: "source-link",
        href: href || "#",
        target: "_blank",
        rel: "noopener",
        text: source.document_title || "Untitled document",
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
      const more = el("button", { type: "button", class: "link-button snippet-more", "aria-expanded": "false", text: "Show more", hidden: short === text });
      more.addEventListener("click", () => {
        const open = more.getAttribute("aria-expanded") === "true";
        shown.textContent = open ? short : text;
        shown.classList.toggle("clamped", open);
        more.textContent = open ? "Show more" : "Show less";
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
    if (isNumber(stats.ttft_s)) parts.push("TTFT " + stats.ttft_s.toFixed(2) + " s");
    if (isNumber(stats.tokens_per_s)) parts.push(stats.tokens_per_s.toFixed(1) + " tok/s");
    if (isNumber(stats.prompt_tokens)) {
      parts.push(
        isNumber(stats.cached_tokens)
          ? stats.cached_tokens + "/" + stats.prompt_tokens + " prompt tokens cached"
          : stats.prompt_tokens + " prompt tokens"
      );
    }
    if (isNumber(stats.completion_tokens)) {
      parts.push(stats.completion_tokens + (stats.completion_tokens === 1 ? " token" : " tokens"));
    }
    return parts.join(" · ");
  }

  const FINISH_BADGES = {
    stopped: ["stopped", "neutral"],
    length: ["length limit", ""],
    abort: ["interrupted", ""],
    error: ["error", "danger"],
  };

  function renderFooter(bubble, message) {
    const body = bodyOf(bubble);
    const old = body.querySelector(".message-footer");
    if (old) old.remove();
    const footer = el("div", { class: "message-footer" });
    const stats = message ? statsText(message.stats) : "";
    if (stats) {
      const s = message.stats;
      const details = [s.model ? "Model: " + s.model : "", isNumber(s.total_s) ? "Total " + s.total_s.toFixed(2) + " s" : ""]
        .filter(Boolean)
        .join(" · ");
      footer.append(el("span", { class: "stats", text: stats, title: details || null }));
    }
    const badge = message && FINISH_BADGES[message.finish_reason];
    if (badge) footer.append(el("span", { class: "badge finish-badge " + badge[1], text: badge[0] }));
    const copy = el(
      "button",
      { type: "button", class: "action-button copy-button", "aria-label": "Copy answer as markdown", title: "Copy answer (markdown)" },
      icon("copy"),
      el("span", { class: "label", text: "Copy" })
    );
    footer.append(el("div", { class: "message-actions" }, copy));
    body.append(footer);
  }

  /** Shows a saved assistant Message in `bubble`. */
  function fillAssistant(bubble, message, fallbackSources) {
    const state = bubbleState.get(bubble) || { raw: "", sources: [], message: null };
    state.raw = typeof message.content === "string" ? message.content : state.raw;
    state.sources = Array.isArray(message.sources) && message.sources.length ? message.sources : fallbackSources || state.sources;
    state.message = message;
    bubbleState.set(bubble, state);
    if (message.id) bubble.dataset.messageId = String(message.id);
    removeDots(bubble);
    bubble.classList.remove("streaming");
    bubble.removeAttribute("aria-busy");
    const content = bubble.querySelector(".content");
    if (state.raw) fillContent(content, state.raw, state.sources);
    else content.replaceChildren(el("p", { class: "hint", text: message.finish_reason === "stopped" ? "Stopped before any text was written." : "No answer." }));
    renderSources(bubble, state.sources);
    renderFooter(bubble, message);
  }

  function showBubbleError(bubble, text, actions) {
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

  function renderMessages(list) {
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

  function lastAssistant() {
    const last = messagesEl.lastElementChild;
    return last && last.classList.contains("assistant") ? last : null;
  }

  /** Only the last saved answer gets a Regenerate button. */
  function updateRegenerateButtons() {
    for (const button of messagesEl.querySelectorAll(".regenerate-button")) button.remove();
    const last = lastAssistant();
    if (!last || !last.dataset.messageId || currentId === null) return;
    if (turn && turn.bubble === last) return;
    const actions = last.querySelector(".message-actions");
    if (!actions) return;
    actions.append(
      el(
        "button",
        { type: "button", class: "action-button regenerate-button", "aria-label": "Regenerate answer", title: "Regenerate answer" },
        icon("refresh"),
        el("span", { class: "label", text: "Regenerate" })
      )
    );
    updateComposer();
  }

  // ---------------------------------------------------------------- scrolling

  function distanceFromBottom() {
    return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight;
  }

  function scrollToBottom(force) {
    if (force) stickToBottom = true;
    if (stickToBottom) scroller.scrollTop = scroller.scrollHeight;
    updateJumpButton();
  }

  function updateJumpButton() {
    jumpButton.hidden = stickToBottom || distanceFromBottom() < AT_BOTTOM_PX || !messagesEl.childElementCount;
  }

  scroller.addEventListener("scroll", () => {
    stickToBottom = distanceFromBottom() < AT_BOTTOM_PX;
    updateJumpButton();
  }, { passive: true });

  jumpButton.addEventListener("click", () => {
    stickToBottom = true;
    scroller.scrollTo({ top: scroller.scrollHeight, behavior: "smooth" });
    jumpButton.hidden = true;
  });

  // ---------------------------------------------------------------- conversation list

  function sortConversations() {
    conversations.sort((a, b) => String(b.updated_at || "").localeCompare(String(a.updated_at || "")) || b.id - a.id);
  }

  function upsertConversation(summary, { touch } = {}) {
    if (!summary || !summary.id) return;
    let item = conversations.find((c) => c.id === summary.id);
    if (!item) {
      item = { id: summary.id, title: "", updated_at: new Date().toISOString() };
      conversations.push(item);
    }
    if (typeof summary.title === "string" && summary.title) item.title = summary.title;
    if (summary.updated_at) item.updated_at = summary.updated_at;
    if (touch) item.updated_at = new Date().toISOString();
    sortConversations();
    renderConversationList();
    if (summary.id === currentId) setHeader(item.title);
  }

  function renderConversationList() {
    if (renamingId !== null) return; // re-rendered when the rename ends
    const fragment = document.createDocumentFragment();
    for (const conv of conversations) {
      const title = conv.title || "New chat";
      const link = el("a", {
        class: "conversation-link",
        href: "/c/" + conv.id + "/",
        text: title,
        title: title + (conv.updated_at ? "\n" + new Date(conv.updated_at).toLocaleString() : ""),
        "aria-current": conv.id === currentId ? "page" : null,
      });
      const actions = el(
        "div",
        { class: "conversation-actions" },
        el("button", { type: "button", class: "icon-button rename-button", "aria-label": "Rename “" + title + "”", title: "Rename" }, icon("pencil")),
        el("button", { type: "button", class: "icon-button delete-button", "aria-label": "Delete “" + title + "”", title: "Delete" }, icon("trash"))
      );
      fragment.append(
        el(
          "li",
          { class: conv.id === currentId ? "active" : "", dataset: { conversationId: String(conv.id) } },
          link,
          actions
        )
      );
    }
    conversationList.replaceChildren(fragment);
    conversationEmpty.hidden = conversations.length > 0;
  }

  async function loadConversations() {
    try {
      const data = await api("GET", "conversations/");
      conversations = Array.isArray(data.conversations) ? data.conversations.slice() : [];
      sortConversations();
      renderConversationList();
      if (currentId !== null) {
        const item = conversations.find((c) => c.id === currentId);
        if (item) setHeader(item.title);
      }
    } catch (error) {
      if (error.status !== 401) toast("Could not load your conversations: " + error.message);
    }
  }

  conversationList.addEventListener("click", (event) => {
    const li = event.target.closest("li[data-conversation-id]");
    if (!li) return;
    const id = parseInt(li.dataset.conversationId, 10);
    if (event.target.closest(".rename-button")) {
      event.preventDefault();
      startRename(li, id);
    } else if (event.target.closest(".delete-button")) {
      event.preventDefault();
      deleteConversation(id);
    } else if (event.target.closest("a.conversation-link")) {
      if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
      event.preventDefault();
      if (id !== currentId) openConversation(id, { push: true });
      closeSidebar();
    }
  });

  function startRename(li, id) {
    const conv = conversations.find((c) => c.id === id);
    if (!conv) return;
    renamingId = id;
    const link = li.querySelector(".conversation-link");
    const field = el("input", { type: "text", class: "rename-input", maxlength: "200", "aria-label": "New title" });
    field.value = conv.title || "";
    link.replaceWith(field);
    li.querySelector(".conversation-actions").hidden = true;
    field.focus();
    field.select();
    let finished = false;
    const finish = async (save) => {
      if (finished) return;
      finished = true;
      const title = field.value.trim().replace(/\s+/g, " ");
      const before = conv.title;
      renamingId = null;
      if (save && title && title !== before) {
        conv.title = title;
        renderConversationList();
        if (id === currentId) setHeader(title);
        try {
          const data = await api("PATCH", "conversations/" + id + "/", { title });
          upsertConversation(data);
        } catch (error) {
          conv.title = before;
          renderConversationList();
          if (id === currentId) setHeader(before);
          toast("Could not rename: " + error.message);
        }
      } else {
        renderConversationList();
      }
      const again = conversationList.querySelector('li[data-conversation-id="' + id + '"] .rename-button');
      if (again && document.activeElement === document.body) again.focus();
    };
    field.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.isComposing) {
        event.preventDefault();
        finish(true);
      } else if (event.key === "Escape") {
        event.preventDefault();
        event.stopPropagation();
        finish(false);
      }
    });
    field.addEventListener("blur", () => finish(true));
  }

  async function deleteConversation(id) {
    const conv = conversations.find((c) => c.id === id);
    const title = conv && conv.title ? "“" + conv.title + "”" : "this conversation";
    if (!window.confirm("Delete " + title + "? This cannot be undone.")) return;
    if (turn && turn.conversationId === id) stopTurn();
    try {
      await api("DELETE", "conversations/" + id + "/");
    } catch (error) {
      if (error.status !== 404) {
        toast("Could not delete: " + error.message);
        return;
      }
    }
    conversations = conversations.filter((c) => c.id !== id);
    renderConversationList();
    if (id === currentId) startNewChat({ push: false, replace: true });
  }

  // ---------------------------------------------------------------- views: new chat / conversation

  function setHeader(title, meta) {
    const text = title || "New chat";
    titleEl.textContent = text;
    document.title = text + " · Cachet";
    if (meta !== undefined) metaEl.textContent = meta;
  }

  function highlightCurrent() {
    for (const li of conversationList.querySelectorAll("li[data-conversation-id]")) {
      const active = parseInt(li.dataset.conversationId, 10) === currentId;
      li.classList.toggle("active", active);
      const link = li.querySelector(".conversation-link");
      if (link) {
        if (active) link.setAttribute("aria-current", "page");
        else link.removeAttribute("aria-current");
      }
    }
  }

  function startNewChat({ push = true, replace = false, focus = true } = {}) {
    currentId = null;
    viewToken += 1;
    messagesEl.replaceChildren();
    newChatPanel.hidden = false;
    setHeader("New chat", "");
    highlightCurrent();
    if (push && window.location.pathname !== "/") history.pushState({ conversation: null }, "", "/");
    else if (replace) history.replaceState({ conversation: null }, "", "/");
    stickToBottom = true;
    updateJumpButton();
    updateComposer();
    closeSidebar();
    if (focus && !PHONE.matches) input.focus();
  }

  async function openConversation(id, { push = false, replace = false } = {}) {
    currentId = id;
    viewToken += 1;
    const token = viewToken;
    if (push) history.pushState({ conversation: id }, "", "/c/" + id + "/");
    else if (replace) history.replaceState({ conversation: id }, "", "/c/" + id + "/");
    newChatPanel.hidden = true;
    const known = conversations.find((c) => c.id === id);
    setHeader(known ? known.title : "Loading…", "");
    highlightCurrent();
    messagesEl.replaceChildren(el("p", { class: "loading-note", text: "Loading conversation…" }));
    updateComposer();
    let data;
    try {
      data = await api("GET", "conversations/" + id + "/");
    } catch (error) {
      if (token !== viewToken) return;
      if (error.status === 404) {
        conversations = conversations.filter((c) => c.id !== id);
        renderConversationList();
        toast("That conversation does not exist (any more).");
        startNewChat({ push: false, replace: true });
        return;
      }
      const retry = el("button", { type: "button", class: "button", text: "Try again" });
      retry.addEventListener("click", () => openConversation(id));
      messagesEl.replaceChildren(
        el("div", { class: "error-message", role: "alert" }, el("p", { text: "Could not load the conversation: " + error.message }), el("div", { class: "error-actions" }, retry))
      );
      return;
    }
    if (token !== viewToken) return;
    const meta = [data.profile && data.profile.name, (data.collections || []).map((c) => c.name).join(", ")]
      .filter(Boolean)
      .join(" · ");
    setHeader(data.title, meta);
    if (data.title && known && known.title !== data.title) upsertConversation({ id, title: data.title });
    renderMessages(Array.isArray(data.messages) ? data.messages : []);
    reattachTurn(id, data.messages || []);
    updateRegenerateButtons();
    scrollToBottom(true);
    updateComposer();
  }

  /** Coming back to a conversation whose answer is still streaming: show the live bubble again. */
  function reattachTurn(id, messages) {
    if (!turn || turn.conversationId !== id) return;
    if (turn.kind === "message") {
      const saved = turn.userMessageId && messages.some((m) => m.id === turn.userMessageId);
      if (!saved) messagesEl.append(turn.userEl);
    } else {
      const last = lastAssistant();
      if (last) last.remove();
    }
    messagesEl.append(turn.bubble);
  }

  function routeFromLocation() {
    const match = /^\/c\/(\d+)\/?$/.exec(window.location.pathname);
    return match ? parseInt(match[1], 10) : null;
  }

  window.addEventListener("popstate", () => {
    const id = routeFromLocation();
    if (id === null) startNewChat({ push: false });
    else if (id !== currentId) openConversation(id);
  });

  newChatButton.addEventListener("click", () => startNewChat({ push: true }));

  // ---------------------------------------------------------------- new chat options

  function selectedCollections() {
    return Array.from(collectionOptions.querySelectorAll("input[type=checkbox]:checked")).map((box) => parseInt(box.value, 10));
  }

  function renderPickers() {
    const collections = (options && options.collections) || [];
    collectionOptions.replaceChildren();
    if (!collections.length) {
      collectionOptions.append(el("p", { class: "hint", text: "No document collections are available to you yet; answers will not cite documents." }));
    }
    for (const collection of collections) {
      const box = el("input", { type: "checkbox", value: String(collection.id), checked: true });
      collectionOptions.append(el("label", { class: "picker-option" }, box, el("span", { text: collection.name })));
    }
    $("#collections-all").hidden = $("#collections-none").hidden = collections.length < 2;
    const profiles = (options && options.profiles) || [];
    profileSelect.replaceChildren(
      ...profiles.map((p) => el("option", { value: String(p.id), selected: p.is_default, text: p.name }))
    );
    profilePicker.hidden = profiles.length < 2;
  }

  $("#collections-all").addEventListener("click", () => {
    for (const box of collectionOptions.querySelectorAll("input[type=checkbox]")) box.checked = true;
    updateComposer();
  });
  $("#collections-none").addEventListener("click", () => {
    for (const box of collectionOptions.querySelectorAll("input[type=checkbox]")) box.checked = false;
    updateComposer();
  });
  collectionOptions.addEventListener("change", updateComposer);

  async function loadOptions(attempt) {
    try {
      options = await api("GET", "options/");
    } catch (error) {
      if (error.status === 401) return;
      if ((attempt || 0) < 4) setTimeout(() => loadOptions((attempt || 0) + 1), 1500 * ((attempt || 0) + 1));
      else toast("Could not load the chat options: " + error.message);
      return;
    }
    maxChars = isNumber(options.max_message_chars) ? options.max_message_chars : Infinity;
    renderPickers();
    setUpUpload();
    updateComposer();
  }

  // ---------------------------------------------------------------- composer

  function autosize() {
    input.style.height = "auto";
    const max = Math.max(120, Math.round(window.innerHeight * 0.4));
    input.style.height = Math.min(input.scrollHeight, max) + "px";
    input.style.overflowY = input.scrollHeight > max ? "auto" : "hidden";
  }

  function updateComposer() {
    const running = turn !== null;
    const length = input.value.length;
    const empty = input.value.trim() === "";
    const over = length > maxChars;
    sendButton.hidden = running;
    stopButton.hidden = !running;
    sendButton.disabled = !wsOpen || running || empty || over;
    if (!wsOpen) {
      composerHint.textContent = everConnected ? "Not connected: reconnecting… (what you type is kept)" : "Connecting…";
      composerHint.classList.add("warn");
      composerHint.style.display = "inline";
      sendButton.title = "Not connected";
    } else if (running) {
      composerHint.textContent = "Answering… press Esc to stop";
      composerHint.classList.remove("warn");
      composerHint.style.display = "";
      sendButton.title = "";
    } else {
      composerHint.textContent = DEFAULT_HINT;
      composerHint.classList.remove("warn");
      composerHint.style.display = "";
      sendButton.title = "";
    }
    if (isFinite(maxChars) && length >= maxChars * 0.8) {
      charCounter.textContent = length.toLocaleString() + " / " + maxChars.toLocaleString();
      charCounter.classList.toggle("warn", length >= maxChars * 0.9 && !over);
      charCounter.classList.toggle("over", over || length >= maxChars);
      charCounter.title = over ? "Too long: shorten the message" : "";
    } else {
      charCounter.textContent = "";
      charCounter.className = "char-counter";
    }
    for (const button of messagesEl.querySelectorAll(".regenerate-button")) button.disabled = !wsOpen || running;
  }

  input.addEventListener("input", () => {
    autosize();
    updateComposer();
  });

  input.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.isComposing || event.keyCode === 229) return; // IME composition: Enter picks a candidate
    event.preventDefault();
    sendMessage();
  });

  composer.addEventListener("submit", (event) => {
    event.preventDefault();
    sendMessage();
  });

  stopButton.addEventListener("click", () => {
    stopTurn();
    input.focus();
  });

  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.isComposing) return;
    if (app.classList.contains("sidebar-open")) {
      closeSidebar();
      menuButton.focus();
      return;
    }
    if (turn) {
      event.preventDefault();
      stopTurn();
    }
  });

  window.addEventListener("resize", autosize);

  // ---------------------------------------------------------------- turns

  function wsSend(frame) {
    if (!ws || !wsOpen) return false;
    try {
      ws.send(JSON.stringify(frame));
      return true;
    } catch (error) {
      return false;
    }
  }

  function setTurn(value) {
    turn = value;
    document.body.classList.toggle("turn-running", turn !== null);
    updateComposer();
  }

  function sendMessage(retryFrame) {
    if (turn || !wsOpen) return;
    const content = retryFrame ? retryFrame.content : input.value.trim();
    if (!content) return;
    if (content.length > maxChars) {
      toast("The message is too long (" + content.length + " characters; the limit is " + maxChars + ").");
      return;
    }
    let frame = retryFrame;
    if (!frame) {
      frame = { type: "message", conversation: currentId, content };
      if (currentId === null) {
        if (options) frame.collections = selectedCollections();
        if (!profilePicker.hidden && profileSelect.value) frame.profile = parseInt(profileSelect.value, 10);
      }
    }
    if (!wsSend(frame)) {
      toast("Not connected: the message was not sent.");
      return;
    }
    newChatPanel.hidden = true;
    const loading = messagesEl.querySelector(".loading-note");
    if (loading) loading.remove();
    for (const button of messagesEl.querySelectorAll(".regenerate-button")) button.remove();
    const userEl = userMessageEl({ content });
    const bubble = assistantMessageEl(true);
    userEl.classList.add("live");
    bubble.classList.add("live");
    messagesEl.append(userEl, bubble);
    setTurn({
      kind: "message",
      frame,
      conversationId: frame.conversation,
      userEl,
      userMessageId: null,
      bubble,
      raw: "",
      sources: [],
      started: false,
      gotToken: false,
      renderQueued: false,
      lastRenderCost: 0,
    });
    if (!retryFrame) {
      input.value = "";
      autosize();
    }
    updateComposer();
    scrollToBottom(true);
    input.focus();
  }

  function regenerate() {
    if (turn || !wsOpen || currentId === null) return;
    const old = lastAssistant();
    if (!wsSend({ type: "regenerate", conversation: currentId })) return;
    const bubble = assistantMessageEl(true);
    bubble.classList.add("live");
    if (old) old.replaceWith(bubble);
    else messagesEl.append(bubble);
    setTurn({
      kind: "regenerate",
      frame: { type: "regenerate", conversation: currentId },
      conversationId: currentId,
      userEl: null,
      userMessageId: null,
      bubble,
      replaced: old,
      raw: "",
      sources: [],
      started: false,
      gotToken: false,
      renderQueued: false,
      lastRenderCost: 0,
    });
    scrollToBottom(true);
    input.focus();
  }

  function stopTurn() {
    if (!turn) return;
    if (turn.stopping) return;
    turn.stopping = true;
    wsSend({ type: "stop" });
    stopButton.disabled = true;
    setTimeout(() => (stopButton.disabled = false), 800);
  }

  function isShown(t) {
    return t.bubble.isConnected;
  }

  function queueRender(t) {
    if (t.renderQueued) return;
    t.renderQueued = true;
    // NOTE: the whole answer is re-rendered per frame; a slow render (very long answers) spaces
    // the frames out so the page stays responsive.
    const wait = t.lastRenderCost > 12 ? t.lastRenderCost * 3 : 0;
    const run = () =>
      requestAnimationFrame(() => {
        t.renderQueued = false;
        renderTurn(t);
      });
    if (wait) setTimeout(run, wait);
    else run();
  }

  function renderTurn(t) {
    if (t.finished) return;
    const started = performance.now();
    const content = t.bubble.querySelector(".content");
    fillContent(content, t.raw, t.sources);
    const state = bubbleState.get(t.bubble);
    if (state) {
      state.raw = t.raw;
      state.sources = t.sources;
    }
    t.lastRenderCost = performance.now() - started;
    if (isShown(t)) scrollToBottom(false);
  }

  function onFrame(frame) {
    switch (frame.type) {
      case "start":
        return onStart(frame);
      case "sources":
        return onSources(frame);
      case "token":
        return onToken(frame);
      case "done":
        return onDone(frame);
      case "error":
        return onError(frame);
      case "pong":
        return undefined;
      default:
        return undefined;
    }
  }

  function onStart(frame) {
    const t = turn;
    if (!t) return;
    t.started = true;
    const conv = frame.conversation || {};
    const wasNew = t.conversationId === null;
    t.conversationId = conv.id;
    if (frame.user_message && frame.user_message.id) {
      t.userMessageId = frame.user_message.id;
      if (t.userEl) t.userEl.dataset.messageId = String(frame.user_message.id);
    }
    if (wasNew && isShown(t) && currentId === null) {
      currentId = conv.id;
      history.pushState({ conversation: conv.id }, "", "/c/" + conv.id + "/");
      const meta = collectionNames(t.frame.collections);
      setHeader(conv.title, meta);
    }
    upsertConversation({ id: conv.id, title: conv.title }, { touch: true });
    highlightCurrent();
  }

  function collectionNames(ids) {
    if (!options || !Array.isArray(ids)) return "";
    const names = options.collections.filter((c) => ids.includes(c.id)).map((c) => c.name);
    let profile = "";
    if (!profilePicker.hidden) {
      const option = profileSelect.selectedOptions[0];
      profile = option ? option.textContent : "";
    }
    return [profile, names.join(", ")].filter(Boolean).join(" · ");
  }

  function onSources(frame) {
    const t = turn;
    if (!t) return;
    t.sources = Array.isArray(frame.sources) ? frame.sources : [];
    const state = bubbleState.get(t.bubble);
    if (state) state.sources = t.sources;
    renderSources(t.bubble, t.sources, true);
    if (isShown(t)) scrollToBottom(false);
  }

  function onToken(frame) {
    const t = turn;
    if (!t || typeof frame.text !== "string") return;
    if (!t.gotToken) {
      t.gotToken = true;
      removeDots(t.bubble);
      t.bubble.classList.add("streaming");
    }
    t.raw += frame.text;
    queueRender(t);
  }

  function onDone(frame) {
    const t = turn;
    if (!t) {
      if (frame.conversation) upsertConversation(frame.conversation);
      return;
    }
    t.finished = true;
    const message = frame.message || { content: t.raw, sources: t.sources, stats: null, finish_reason: null };
    fillAssistant(t.bubble, message, t.sources);
    setTurn(null);
    if (frame.conversation) {
      upsertConversation(frame.conversation, { touch: true });
      if (frame.conversation.id === currentId) setHeader(frame.conversation.title);
    }
    if (isShown(t)) {
      updateRegenerateButtons();
      // NOTE: no jump to the sources list that just opened: the reader stays where the text ended.
      updateJumpButton();
    }
  }

  function errorText(frame) {
    const message = frame.message || "Something went wrong.";
    switch (frame.code) {
      case "engine_unavailable":
        return "The model is not available right now (" + message.replace(/[.\s]+$/, "") + "). Try again in a moment.";
      case "engine_error":
        return "The model failed while answering: " + message;
      case "context_overflow":
        return "This question is too long for the model's context window. Shorten it, or start a new chat. (" + message + ")";
      case "too_long":
        return "The message is too long: " + message;
      case "not_found":
        return "Not found: " + message;
      case "busy":
        return "An answer is still running; wait for it or stop it first.";
      case "nothing_to_regenerate":
        return "There is no answer to regenerate.";
      default:
        return message.charAt(0).toUpperCase() + message.slice(1);
    }
  }

  const RETRYABLE = new Set(["engine_unavailable", "engine_error", "busy"]);

  function onError(frame) {
    const t = turn;
    const text = errorText(frame);
    if (!t) {
      toast(text);
      return;
    }
    t.finished = true;
    setTurn(null);
    if (frame.conversation && !t.conversationId) t.conversationId = frame.conversation;
    const actions = [];
    if (RETRYABLE.has(frame.code)) {
      const retry = el("button", { type: "button", class: "button retry-button", text: "Retry" });
      retry.addEventListener("click", () => retryTurn(t, retry));
      actions.push(retry);
    }
    if (t.kind === "regenerate" && !t.started && t.replaced) {
      // The old answer is still there: put it back and explain why nothing changed.
      t.bubble.replaceWith(t.replaced);
      showBubbleError(t.replaced, text, actions);
      t.bubble = t.replaced;
      updateRegenerateButtons();
    } else {
      if (t.raw) fillContent(t.bubble.querySelector(".content"), t.raw, t.sources);
      renderSources(t.bubble, t.sources, false);
      showBubbleError(t.bubble, text, actions);
    }
    if (isShown(t)) scrollToBottom(false);
    if (t.kind === "message" && !t.started && !input.value.trim()) {
      // Nothing was saved: give the question back so it can be edited and sent again.
      input.value = t.frame.content;
      autosize();
      updateComposer();
    }
  }

  /** Retries a failed turn: before `start` nothing was saved, so the same frame is sent again;
   * after it the question is saved and `regenerate` answers the conversation's last question. */
  function retryTurn(t, button) {
    if (turn || !wsOpen) {
      toast(wsOpen ? "Wait for the running answer first." : "Not connected yet.");
      return;
    }
    button.disabled = true;
    if (t.kind === "message" && !t.started) {
      if (input.value === t.frame.content) {
        input.value = "";
        autosize();
      }
      t.bubble.remove();
      if (t.userEl) t.userEl.remove();
      sendMessage(t.frame);
      return;
    }
    if (t.conversationId !== currentId) return;
    const box = t.bubble.querySelector(":scope .body > .error-message");
    if (box) box.remove();
    if (!lastAssistant()) messagesEl.append(t.bubble);
    regenerate();
  }

  /** The socket dropped during a turn: the server saved what it had; reload it when back. */
  function interruptTurn() {
    const t = turn;
    if (!t) return;
    t.finished = true;
    setTurn(null);
    removeDots(t.bubble);
    t.bubble.classList.remove("streaming");
    t.bubble.removeAttribute("aria-busy");
    if (t.raw) fillContent(t.bubble.querySelector(".content"), t.raw, t.sources);
    renderSources(t.bubble, t.sources, false);
    const body = bodyOf(t.bubble);
    body.append(el("div", { class: "message-footer" }, el("span", { class: "badge interrupted-badge", text: "interrupted: connection lost, reloading when back…" })));
    if (t.conversationId !== null) reloadAfterReconnect = { conversationId: t.conversationId };
    else reloadAfterReconnect = { conversationId: null, content: t.frame.content };
  }

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
      const state = bubbleState.get(bubble);
      flashCopied(copy, await copyText(state ? state.raw : ""));
      return;
    }
    if (target.closest(".regenerate-button")) {
      regenerate();
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

  // ---------------------------------------------------------------- WebSocket

  function setStatus(state) {
    statusEl.dataset.state = state;
    const labels = { connecting: "Connecting…", reconnecting: "Reconnecting…", open: "Connected", closed: "Disconnected" };
    statusEl.replaceChildren(labels[state] || state);
    if (state === "reconnecting" && reconnectAttempt >= 3) {
      const now = el("button", { type: "button", text: "Retry now" });
      now.addEventListener("click", () => connectNow());
      statusEl.append(" ", now);
    }
  }

  function connect() {
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    setStatus(everConnected ? "reconnecting" : "connecting");
    let socket;
    try {
      socket = new WebSocket(wsUrl(config.ws_path));
    } catch (error) {
      scheduleReconnect();
      return;
    }
    ws = socket;
    let opened = false;
    socket.addEventListener("open", () => {
      if (ws !== socket) return;
      opened = true;
      wsOpen = true;
      reconnectAttempt = 0;
      const first = !everConnected;
      everConnected = true;
      setStatus("open");
      updateComposer();
      if (!first) afterReconnect();
    });
    socket.addEventListener("message", (event) => {
      if (ws !== socket || typeof event.data !== "string") return;
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      if (frame && typeof frame === "object") onFrame(frame);
    });
    socket.addEventListener("close", (event) => {
      if (ws !== socket) return;
      ws = null;
      wsOpen = false;
      if (unloading) return;
      if (event.code === 4401) {
        goToLogin();
        return;
      }
      interruptTurn();
      updateComposer();
      scheduleReconnect(opened);
    });
  }

  function scheduleReconnect(wasOpen) {
    const base = Math.min(RECONNECT_MAX_MS, RECONNECT_MIN_MS * 2 ** reconnectAttempt);
    const delay = Math.round(base * (0.75 + Math.random() * 0.5));
    reconnectAttempt += 1;
    setStatus(everConnected ? "reconnecting" : "connecting");
    clearTimeout(reconnectTimer);
    reconnectTimer = setTimeout(connect, delay);
    // A socket refused again and again may mean the session ended: check with a plain request.
    if (!wasOpen && reconnectAttempt % 3 === 0) api("GET", "options/").catch(() => {});
  }

  function connectNow() {
    if (wsOpen || (ws && ws.readyState === WebSocket.CONNECTING)) return;
    connect();
  }

  function afterReconnect() {
    const pending = reloadAfterReconnect;
    reloadAfterReconnect = null;
    loadConversations();
    if (!pending) return;
    if (pending.conversationId !== null && pending.conversationId === currentId) {
      openConversation(currentId);
    } else if (pending.conversationId === null && pending.content && !input.value.trim()) {
      // The question may not have reached the server: offer it again.
      input.value = pending.content;
      autosize();
      updateComposer();
    }
  }

  setInterval(() => {
    if (wsOpen && !turn) wsSend({ type: "ping" });
  }, PING_INTERVAL_MS);

  window.addEventListener("online", connectNow);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && !wsOpen && reconnectTimer) connectNow();
  });
  window.addEventListener("pagehide", () => {
    unloading = true;
  });
  window.addEventListener("pageshow", (event) => {
    unloading = false;
    if (event.persisted && !wsOpen) connectNow();
  });

  // ---------------------------------------------------------------- sidebar (phone)

  function openSidebar() {
    app.classList.add("sidebar-open");
    backdrop.hidden = false;
    menuButton.setAttribute("aria-expanded", "true");
    newChatButton.focus();
  }

  function closeSidebar() {
    if (!app.classList.contains("sidebar-open")) return;
    app.classList.remove("sidebar-open");
    backdrop.hidden = true;
    menuButton.setAttribute("aria-expanded", "false");
  }

  menuButton.addEventListener("click", () => (app.classList.contains("sidebar-open") ? closeSidebar() : openSidebar()));
  backdrop.addEventListener("click", closeSidebar);
  $("#sidebar-close").addEventListener("click", () => {
    closeSidebar();
    menuButton.focus();
  });
  PHONE.addEventListener("change", () => {
    if (!PHONE.matches) closeSidebar();
  });

  // ---------------------------------------------------------------- logout

  logoutForm.action = config.logout_url;
  logoutForm.addEventListener("submit", () => {
    unloading = true;
    const field = logoutForm.querySelector("input[name=csrfmiddlewaretoken]");
    const token = getCookie("csrftoken");
    if (field && token) field.value = token;
  });

  // ---------------------------------------------------------------- upload (staff)

  const STATUS_LABELS = { uploading: "Uploading", queued: "Queued", processing: "Processing", ready: "Ready", failed: "Failed" };

  function setUpUpload() {
    const upload = options && options.upload;
    if (!upload || !upload.allowed) {
      uploadPanel.hidden = true;
      return;
    }
    uploadPanel.hidden = false;
    uploadCollection.replaceChildren(...(upload.collections || []).map((c) => el("option", { value: String(c.id), text: c.name })));
    const noCollections = !(upload.collections || []).length;
    uploadButton.disabled = noCollections;
    uploadHint.textContent = noCollections
      ? "Create a collection in the admin first."
      : isNumber(upload.max_upload_mb) ? "Up to " + upload.max_upload_mb + " MB." : "";
  }

  function showUploadError(message) {
    uploadError.hidden = !message;
    uploadError.textContent = message || "";
  }

  function uploadItem(name) {
    const bar = el("div", { class: "progress-bar" });
    const status = el("span", { class: "upload-status", text: "Uploading…" });
    const item = el(
      "li",
      { class: "upload-progress", dataset: { status: "uploading" } },
      el("span", { class: "upload-name", text: name, title: name }),
      el("div", { class: "progress-track", role: "progressbar", "aria-label": "Progress of " + name, "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": "0" }, bar),
      status
    );
    uploadList.prepend(item);
    return item;
  }

  function showProgress(item, status, progress, error) {
    item.dataset.status = status;
    const pct = status === "ready" ? 100 : Math.max(0, Math.min(100, Math.round(progress || 0)));
    item.querySelector(".progress-bar").style.width = pct + "%";
    item.querySelector(".progress-track").setAttribute("aria-valuenow", String(pct));
    const label = STATUS_LABELS[status] || status;
    let text = label;
    if (status === "processing" || status === "uploading") text = label + " " + pct + "%";
    if (status === "failed") text = "Failed" + (error ? ": " + error : "");
    item.querySelector(".upload-status").textContent = text;
  }

  function sendUpload(file, collection, item) {
    return new Promise((resolve, reject) => {
      const body = new FormData();
      body.append("file", file);
      body.append("collection", collection);
      const xhr = new XMLHttpRequest();
      xhr.open("POST", config.api_root + "documents/");
      xhr.setRequestHeader("X-CSRFToken", getCookie("csrftoken"));
      xhr.setRequestHeader("Accept", "application/json");
      xhr.upload.addEventListener("progress", (event) => {
        if (event.lengthComputable) showProgress(item, "uploading", (event.loaded / event.total) * 100);
      });
      xhr.addEventListener("load", () => {
        let data = null;
        try {
          data = JSON.parse(xhr.responseText);
        } catch (error) {
          data = null;
        }
        if (xhr.status === 201 || xhr.status === 200) {
          if (data && data.document) resolve(data.document);
          else reject(new ApiError(xhr.status, "bad_response", "The server sent an unreadable answer."));
          return;
        }
        if (xhr.status === 401) goToLogin();
        let message = data && data.error && data.error.message;
        if (!message) {
          message = xhr.status === 413
            ? "The file is too large" + (options && options.upload && options.upload.max_upload_mb ? " (limit " + options.upload.max_upload_mb + " MB)." : ".")
            : "The upload failed (" + xhr.status + ").";
        }
        reject(new ApiError(xhr.status, data && data.error ? data.error.code : "http_" + xhr.status, message));
      });
      xhr.addEventListener("error", () => reject(new ApiError(0, "network", "The upload failed: could not reach the server.")));
      xhr.send(body);
    });
  }

  function watchDocument(documentId, item, attempt) {
    let finished = false;
    let socket;
    try {
      socket = new WebSocket(wsUrl("/ws/documents/" + documentId + "/progress/"));
    } catch (error) {
      showProgress(item, "failed", 0, "could not follow the progress");
      return;
    }
    socket.addEventListener("message", (event) => {
      let row;
      try {
        row = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      if (!row || row.type !== "document.progress") return;
      showProgress(item, row.status, row.progress, row.error);
      if (row.status === "ready" || row.status === "failed") {
        finished = true;
        socket.close();
        if (row.status === "ready") {
          const name = item.querySelector(".upload-name");
          const link = el("a", { class: "upload-name", href: "/documents/" + documentId + "/", target: "_blank", rel: "noopener", text: name.textContent, title: name.textContent });
          name.replaceWith(link);
        }
      }
    });
    socket.addEventListener("close", (event) => {
      if (finished || unloading) return;
      if (event.code === 4003 || event.code === 4004) {
        showProgress(item, "failed", 0, event.code === 4003 ? "not allowed to follow this document" : "the document was removed");
        return;
      }
      if ((attempt || 0) >= 6) {
        item.querySelector(".upload-status").textContent = "Progress unavailable (connection lost); check the admin.";
        return;
      }
      const delay = Math.min(RECONNECT_MAX_MS, RECONNECT_MIN_MS * 2 ** (attempt || 0));
      setTimeout(() => watchDocument(documentId, item, (attempt || 0) + 1), delay);
    });
  }

  uploadForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    showUploadError("");
    const file = uploadFile.files && uploadFile.files[0];
    if (!file) {
      showUploadError("Choose a file to upload.");
      uploadFile.focus();
      return;
    }
    if (!uploadCollection.value) {
      showUploadError("Choose a collection.");
      return;
    }
    const limit = options && options.upload && options.upload.max_upload_mb;
    if (isNumber(limit) && file.size > limit * 1024 * 1024) {
      showUploadError(file.name + " is larger than the " + limit + " MB limit.");
      return;
    }
    uploadButton.disabled = true;
    const item = uploadItem(file.name);
    try {
      const doc = await sendUpload(file, uploadCollection.value, item);
      item.dataset.documentId = String(doc.id);
      if (doc.title) {
        item.querySelector(".upload-name").textContent = doc.title;
      }
      showProgress(item, doc.status || "queued", 0, "");
      uploadForm.reset();
      if (doc.status !== "ready" && doc.status !== "failed") watchDocument(doc.id, item, 0);
    } catch (error) {
      item.remove();
      showUploadError(error.message);
    } finally {
      uploadButton.disabled = false;
    }
  });

  // ---------------------------------------------------------------- start

  function start() {
    if (!markdown || !window.DOMPurify) {
      toast("The markdown libraries did not load; answers are shown as plain text.");
    }
    setStatus("connecting");
    autosize();
    updateComposer();
    loadOptions(0);
    loadConversations();
    const id = isNumber(config.conversation_id) ? config.conversation_id : routeFromLocation();
    if (id !== null) openConversation(id, { replace: routeFromLocation() !== id });
    else startNewChat({ push: false });
    history.replaceState({ conversation: id }, "", window.location.href);
    connect();
  }

  start();
})();
