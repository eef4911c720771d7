/*
 * The chat WebSocket (docs/chat-protocol.md): connect, reconnect with backoff and jitter, ping,
 * and the status pill. It knows nothing of turns: `connect()` gets the page's handlers once.
 */

import { api, goToLogin } from "./api.js";
import { config, PING_INTERVAL_MS, RECONNECT_MAX_MS, RECONNECT_MIN_MS } from "./config.js";
import { el, statusEl } from "./dom.js";
import { gettext } from "./i18n.js";
import { state } from "./state.js";

/** The socket, its reconnect schedule and the page's handlers: this module's own state. */
const connection = {
  ws: null,
  reconnectAttempt: 0,
  reconnectTimer: null,
  handlers: { onOpen() {}, onFrame() {}, onDrop() {} },
};

export function wsUrl(path) {
  return (window.location.protocol === "https:" ? "wss://" : "ws://") + window.location.host + path;
}

export function wsSend(frame) {
  if (!connection.ws || !state.wsOpen) return false;
  try {
    connection.ws.send(JSON.stringify(frame));
    return true;
  } catch (error) {
    return false;
  }
}

export function setStatus(status) {
  statusEl.dataset.state = status;
  const labels = {
    connecting: gettext("Connecting…"),
    reconnecting: gettext("Reconnecting…"),
    open: gettext("Connected"),
    closed: gettext("Disconnected"),
  };
  statusEl.replaceChildren(labels[status] || status);
  if (status === "reconnecting" && connection.reconnectAttempt >= 3) {
    const now = el("button", { type: "button", text: gettext("Retry now") });
    now.addEventListener("click", () => connectNow());
    statusEl.append(" ", now);
  }
}

function openSocket() {
  clearTimeout(connection.reconnectTimer);
  connection.reconnectTimer = null;
  setStatus(state.everConnected ? "reconnecting" : "connecting");
  let socket;
  try {
    socket = new WebSocket(wsUrl(config.ws_path));
  } catch (error) {
    scheduleReconnect();
    return;
  }
  connection.ws = socket;
  let opened = false;
  socket.addEventListener("open", () => {
    if (connection.ws !== socket) return;
    opened = true;
    state.wsOpen = true;
    connection.reconnectAttempt = 0;
    const first = !state.everConnected;
    state.everConnected = true;
    setStatus("open");
    connection.handlers.onOpen(first);
  });
  socket.addEventListener("message", (event) => {
    if (connection.ws !== socket || typeof event.data !== "string") return;
    let frame;
    try {
      frame = JSON.parse(event.data);
    } catch (error) {
      return;
    }
    if (frame && typeof frame === "object") connection.handlers.onFrame(frame);
  });
  socket.addEventListener("close", (event) => {
    if (connection.ws !== socket) return;
    connection.ws = null;
    state.wsOpen = false;
    if (state.unloading) return;
    if (event.code === 4401) {
      goToLogin();
      return;
    }
    connection.handlers.onDrop();
    scheduleReconnect(opened);
  });
}

function scheduleReconnect(wasOpen) {
  const base = Math.min(RECONNECT_MAX_MS, RECONNECT_MIN_MS * 2 ** connection.reconnectAttempt);
  const delay = Math.round(base * (0.75 + Math.random() * 0.5));
  connection.reconnectAttempt += 1;
  setStatus(state.everConnected ? "reconnecting" : "connecting");
  clearTimeout(connection.reconnectTimer);
  connection.reconnectTimer = setTimeout(openSocket, delay);
  // A socket refused again and again may mean the session ended: check with a plain request.
  if (!wasOpen && connection.reconnectAttempt % 3 === 0) api("GET", "options/").catch(() => {});
}

function connectNow() {
  if (state.wsOpen || (connection.ws && connection.ws.readyState === WebSocket.CONNECTING)) return;
  openSocket();
}

/**
 * Opens the socket and keeps it open. `onOpen(first)`: it opened (`first`: for the first time);
 * `onFrame(frame)`: a server frame arrived; `onDrop()`: it closed unexpectedly (a reconnect is
 * already scheduled).
 */
export function connect({ onOpen, onFrame, onDrop }) {
  connection.handlers = { onOpen, onFrame, onDrop };
  setInterval(() => {
    if (state.wsOpen && !state.turn) wsSend({ type: "ping" });
  }, PING_INTERVAL_MS);

  window.addEventListener("online", connectNow);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && !state.wsOpen && connection.reconnectTimer) connectNow();
  });
  window.addEventListener("pagehide", () => {
    state.unloading = true;
  });
  window.addEventListener("pageshow", (event) => {
    state.unloading = false;
    if (event.persisted && !state.wsOpen) connectNow();
  });
  openSocket();
}
