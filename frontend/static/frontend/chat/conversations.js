/*
 * The conversation list in the sidebar (rename, delete) and the view it selects: a new chat or
 * one conversation, kept in step with the URL (/ or /c/<id>/) and the browser's history.
 */

import { api } from "./api.js";
import { stopTurn, updateComposer } from "./composer.js";
import { PHONE } from "./config.js";
import {
  conversationEmpty,
  conversationList,
  el,
  icon,
  input,
  messagesEl,
  metaEl,
  newChatButton,
  newChatPanel,
  titleEl,
} from "./dom.js";
import { formatDateTime, gettext, interpolate } from "./i18n.js";
import { lastAssistant, renderMessages, updateRegenerateButtons } from "./messages.js";
import { followNewText, scrollToBottom } from "./scrolling.js";
import { closeSidebar } from "./sidebar.js";
import { state } from "./state.js";
import { toast } from "./toasts.js";

/** This module's own state: the list as shown, and what a slow load must not overwrite. */
let conversations = []; // [{id, title, updated_at}], newest first
let viewToken = 0; // bumped whenever the view changes; stale loads check it
let renamingId = null;

function sortConversations() {
  conversations.sort((a, b) => String(b.updated_at || "").localeCompare(String(a.updated_at || "")) || b.id - a.id);
}

export function upsertConversation(summary, { touch } = {}) {
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
  if (summary.id === state.currentId) setHeader(item.title);
}

function renderConversationList() {
  if (renamingId !== null) return; // re-rendered when the rename ends
  const fragment = document.createDocumentFragment();
  for (const conv of conversations) {
    const title = conv.title || gettext("New chat");
    const link = el("a", {
      class: "conversation-link",
      href: "/c/" + conv.id + "/",
      text: title,
      title: title + (conv.updated_at ? "\n" + formatDateTime(conv.updated_at) : ""),
      "aria-current": conv.id === state.currentId ? "page" : null,
    });
    const actions = el(
      "div",
      { class: "conversation-actions" },
      el(
        "button",
        {
          type: "button",
          class: "icon-button rename-button",
          "aria-label": interpolate(gettext("Rename “%(title)s”"), { title }),
          title: gettext("Rename"),
        },
        icon("pencil")
      ),
      el(
        "button",
        {
          type: "button",
          class: "icon-button delete-button",
          "aria-label": interpolate(gettext("Delete “%(title)s”"), { title }),
          title: gettext("Delete"),
        },
        icon("trash")
      )
    );
    fragment.append(
      el(
        "li",
        { class: conv.id === state.currentId ? "active" : "", dataset: { conversationId: String(conv.id) } },
        link,
        actions
      )
    );
  }
  conversationList.replaceChildren(fragment);
  conversationEmpty.hidden = conversations.length > 0;
}

export async function loadConversations() {
  try {
    const data = await api("GET", "conversations/");
    conversations = Array.isArray(data.conversations) ? data.conversations.slice() : [];
    sortConversations();
    renderConversationList();
    if (state.currentId !== null) {
      const item = conversations.find((c) => c.id === state.currentId);
      if (item) setHeader(item.title);
    }
  } catch (error) {
    if (error.status !== 401) toast(interpolate(gettext("Could not load your conversations: %(error)s"), { error: error.message }));
  }
}

function startRename(li, id) {
  const conv = conversations.find((c) => c.id === id);
  if (!conv) return;
  renamingId = id;
  const link = li.querySelector(".conversation-link");
  const field = el("input", { type: "text", class: "rename-input", maxlength: "200", "aria-label": gettext("New title") });
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
      if (id === state.currentId) setHeader(title);
      try {
        const data = await api("PATCH", "conversations/" + id + "/", { title });
        upsertConversation(data);
      } catch (error) {
        conv.title = before;
        renderConversationList();
        if (id === state.currentId) setHeader(before);
        toast(interpolate(gettext("Could not rename: %(error)s"), { error: error.message }));
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
  const question = conv && conv.title
    ? interpolate(gettext("Delete “%(title)s”? This cannot be undone."), { title: conv.title })
    : gettext("Delete this conversation? This cannot be undone.");
  if (!window.confirm(question)) return;
  if (state.turn && state.turn.conversationId === id) stopTurn();
  try {
    await api("DELETE", "conversations/" + id + "/");
  } catch (error) {
    if (error.status !== 404) {
      toast(interpolate(gettext("Could not delete: %(error)s"), { error: error.message }));
      return;
    }
  }
  conversations = conversations.filter((c) => c.id !== id);
  renderConversationList();
  if (id === state.currentId) startNewChat({ push: false, replace: true });
}

export function setHeader(title, meta) {
  const text = title || gettext("New chat");
  titleEl.textContent = text;
  document.title = text + " · Cachet";
  if (meta !== undefined) metaEl.textContent = meta;
}

export function highlightCurrent() {
  for (const li of conversationList.querySelectorAll("li[data-conversation-id]")) {
    const active = parseInt(li.dataset.conversationId, 10) === state.currentId;
    li.classList.toggle("active", active);
    const link = li.querySelector(".conversation-link");
    if (link) {
      if (active) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }
}

export function startNewChat({ push = true, replace = false, focus = true } = {}) {
  state.currentId = null;
  viewToken += 1;
  messagesEl.replaceChildren();
  newChatPanel.hidden = false;
  setHeader(gettext("New chat"), "");
  highlightCurrent();
  if (push && window.location.pathname !== "/") history.pushState({ conversation: null }, "", "/");
  else if (replace) history.replaceState({ conversation: null }, "", "/");
  followNewText();
  updateComposer();
  closeSidebar();
  if (focus && !PHONE.matches) input.focus();
}

export async function openConversation(id, { push = false, replace = false } = {}) {
  state.currentId = id;
  viewToken += 1;
  const token = viewToken;
  if (push) history.pushState({ conversation: id }, "", "/c/" + id + "/");
  else if (replace) history.replaceState({ conversation: id }, "", "/c/" + id + "/");
  newChatPanel.hidden = true;
  const known = conversations.find((c) => c.id === id);
  setHeader(known ? known.title : gettext("Loading…"), "");
  highlightCurrent();
  messagesEl.replaceChildren(el("p", { class: "loading-note", text: gettext("Loading conversation…") }));
  updateComposer();
  let data;
  try {
    data = await api("GET", "conversations/" + id + "/");
  } catch (error) {
    if (token !== viewToken) return;
    if (error.status === 404) {
      conversations = conversations.filter((c) => c.id !== id);
      renderConversationList();
      toast(gettext("That conversation does not exist (any more)."));
      startNewChat({ push: false, replace: true });
      return;
    }
    const retry = el("button", { type: "button", class: "button", text: gettext("Try again") });
    retry.addEventListener("click", () => openConversation(id));
    messagesEl.replaceChildren(
      el("div", { class: "error-message", role: "alert" }, el("p", { text: interpolate(gettext("Could not load the conversation: %(error)s"), { error: error.message }) }), el("div", { class: "error-actions" }, retry))
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
  const turn = state.turn;
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

export function routeFromLocation() {
  const match = /^\/c\/(\d+)\/?$/.exec(window.location.pathname);
  return match ? parseInt(match[1], 10) : null;
}

export function setUpConversations() {
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
      if (id !== state.currentId) openConversation(id, { push: true });
      closeSidebar();
    }
  });

  window.addEventListener("popstate", () => {
    const id = routeFromLocation();
    if (id === null) startNewChat({ push: false });
    else if (id !== state.currentId) openConversation(id);
  });

  newChatButton.addEventListener("click", () => startNewChat({ push: true }));
}
