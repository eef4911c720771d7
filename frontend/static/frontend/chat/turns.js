/*
 * A chat turn, from Send to `done`: the frame sent (`message` or `regenerate`), the live bubble,
 * and the server's frames (start, sources, token, done, error; docs/chat-protocol.md) applied to
 * it. A turn cut by a dropped socket is reloaded from the server once the socket is back.
 *
 * The running turn is `state.turn`:
 *   {kind: "message" | "regenerate", frame, conversationId, userEl, userMessageId, bubble,
 *    replaced (regenerate: the old answer), raw, sources, started, gotToken, stopping, finished,
 *    renderQueued, lastRenderCost}
 */

import { autosize, updateComposer } from "./composer.js";
import {
  highlightCurrent,
  loadConversations,
  openConversation,
  setHeader,
  upsertConversation,
} from "./conversations.js";
import { el, input, messagesEl, newChatPanel, profilePicker, profileSelect } from "./dom.js";
import { formatNumber, gettext, interpolate } from "./i18n.js";
import { fillContent } from "./markdown.js";
import { chosenModel } from "./model_picker.js";
import {
  assistantMessageEl,
  bodyOf,
  fillAssistant,
  lastAssistant,
  removeDots,
  renderSources,
  showBubbleError,
  updateRegenerateButtons,
  userMessageEl,
} from "./messages.js";
import { collectionNames, selectedCollections } from "./options.js";
import { scrollToBottom, updateJumpButton } from "./scrolling.js";
import { wsSend } from "./socket.js";
import { bubbles, state } from "./state.js";
import { toast } from "./toasts.js";

/** {conversationId, content?} when a turn was cut by a disconnect; handled by afterReconnect. */
let reloadAfterReconnect = null;

function setTurn(value) {
  state.turn = value;
  document.body.classList.toggle("turn-running", value !== null);
  updateComposer();
}

/** Sends the composer's text (or, for a retry, the frame that failed) and shows the live turn. */
export function sendMessage(retryFrame) {
  if (state.turn || !state.wsOpen) return;
  const content = retryFrame ? retryFrame.content : input.value.trim();
  if (!content) return;
  if (content.length > state.maxChars) {
    const counts = { length: formatNumber(content.length), limit: formatNumber(state.maxChars) };
    toast(interpolate(gettext("The message is too long (%(length)s characters; the limit is %(limit)s)."), counts));
    return;
  }
  let frame = retryFrame;
  if (!frame) {
    frame = { type: "message", conversation: state.currentId, content };
    const model = chosenModel();
    if (model) frame.model = model;
    if (state.currentId === null) {
      if (state.options) frame.collections = selectedCollections();
      if (!profilePicker.hidden && profileSelect.value) frame.profile = parseInt(profileSelect.value, 10);
    }
  }
  if (!wsSend(frame)) {
    toast(gettext("Not connected: the message was not sent."));
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

export function regenerate() {
  if (state.turn || !state.wsOpen || state.currentId === null) return;
  const old = lastAssistant();
  const frame = { type: "regenerate", conversation: state.currentId };
  const model = chosenModel();
  if (model) frame.model = model;
  if (!wsSend(frame)) return;
  const bubble = assistantMessageEl(true);
  bubble.classList.add("live");
  if (old) old.replaceWith(bubble);
  else messagesEl.append(bubble);
  setTurn({
    kind: "regenerate",
    frame,
    conversationId: state.currentId,
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
  const shown = bubbles.get(t.bubble);
  if (shown) {
    shown.raw = t.raw;
    shown.sources = t.sources;
  }
  t.lastRenderCost = performance.now() - started;
  if (isShown(t)) scrollToBottom(false);
}

/** One frame from the chat socket. */
export function onFrame(frame) {
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
  const t = state.turn;
  if (!t) return;
  t.started = true;
  const conv = frame.conversation || {};
  const wasNew = t.conversationId === null;
  t.conversationId = conv.id;
  if (frame.user_message && frame.user_message.id) {
    t.userMessageId = frame.user_message.id;
    if (t.userEl) t.userEl.dataset.messageId = String(frame.user_message.id);
  }
  if (wasNew && isShown(t) && state.currentId === null) {
    state.currentId = conv.id;
    history.pushState({ conversation: conv.id }, "", "/c/" + conv.id + "/");
    const meta = collectionNames(t.frame.collections);
    setHeader(conv.title, meta);
  }
  upsertConversation({ id: conv.id, title: conv.title }, { touch: true });
  highlightCurrent();
}

function onSources(frame) {
  const t = state.turn;
  if (!t) return;
  t.sources = Array.isArray(frame.sources) ? frame.sources : [];
  const shown = bubbles.get(t.bubble);
  if (shown) shown.sources = t.sources;
  renderSources(t.bubble, t.sources, true);
  if (isShown(t)) scrollToBottom(false);
}

function onToken(frame) {
  const t = state.turn;
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
  const t = state.turn;
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
    if (frame.conversation.id === state.currentId) setHeader(frame.conversation.title);
  }
  if (isShown(t)) {
    updateRegenerateButtons();
    // NOTE: no jump to the sources list that just opened: the reader stays where the text ended.
    updateJumpButton();
  }
}

/** The error frame's text: the server's message (in the page's language where it has one) in a
 * sentence that says what to do. */
function errorText(frame) {
  const message = frame.message || gettext("Something went wrong.");
  const detail = { message, detail: message.replace(/[.。\s]+$/, "") };
  switch (frame.code) {
    case "engine_unavailable":
      return interpolate(gettext("The model is not available right now (%(detail)s). Try again in a moment."), detail);
    case "engine_error":
      return interpolate(gettext("The model failed while answering: %(message)s"), detail);
    case "context_overflow":
      return interpolate(
        gettext("This question is too long for the model's context window. Shorten it, or start a new chat. (%(message)s)"),
        detail
      );
    case "too_long":
      return interpolate(gettext("The message is too long: %(message)s"), detail);
    case "not_found":
      return interpolate(gettext("Not found: %(message)s"), detail);
    case "busy":
      return gettext("An answer is still running; wait for it or stop it first.");
    case "nothing_to_regenerate":
      return gettext("There is no answer to regenerate.");
    default:
      return message.charAt(0).toUpperCase() + message.slice(1);
  }
}

const RETRYABLE = new Set(["engine_unavailable", "engine_error", "busy"]);

function onError(frame) {
  const t = state.turn;
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
    const retry = el("button", { type: "button", class: "button retry-button", text: gettext("Retry") });
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
  if (state.turn || !state.wsOpen) {
    toast(state.wsOpen ? gettext("Wait for the running answer first.") : gettext("Not connected yet."));
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
  if (t.conversationId !== state.currentId) return;
  const box = t.bubble.querySelector(":scope .body > .error-message");
  if (box) box.remove();
  if (!lastAssistant()) messagesEl.append(t.bubble);
  regenerate();
}

/** The socket dropped during a turn: the server saved what it had; reload it when back. */
export function interruptTurn() {
  const t = state.turn;
  if (!t) return;
  t.finished = true;
  setTurn(null);
  removeDots(t.bubble);
  t.bubble.classList.remove("streaming");
  t.bubble.removeAttribute("aria-busy");
  if (t.raw) fillContent(t.bubble.querySelector(".content"), t.raw, t.sources);
  renderSources(t.bubble, t.sources, false);
  const body = bodyOf(t.bubble);
  body.append(el("div", { class: "message-footer" }, el("span", { class: "badge interrupted-badge", text: gettext("interrupted: connection lost, reloading when back…") })));
  if (t.conversationId !== null) reloadAfterReconnect = { conversationId: t.conversationId };
  else reloadAfterReconnect = { conversationId: null, content: t.frame.content };
}

/** The socket is back after a drop: refresh the list and the turn it cut, if any. */
export function afterReconnect() {
  const pending = reloadAfterReconnect;
  reloadAfterReconnect = null;
  loadConversations();
  if (!pending) return;
  if (pending.conversationId !== null && pending.conversationId === state.currentId) {
    openConversation(state.currentId);
  } else if (pending.conversationId === null && pending.content && !input.value.trim()) {
    // The question may not have reached the server: offer it again.
    input.value = pending.content;
    autosize();
    updateComposer();
  }
}
