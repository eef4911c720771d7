/* The page's elements (chat.html) and the two builders every view uses: el() and icon(). */

export const $ = (selector, root) => (root || document).querySelector(selector);

export const app = $("#app");
export const backdrop = $("#backdrop");
export const menuButton = $("#menu-button");
export const conversationList = $("#conversation-list");
export const conversationEmpty = $("#conversation-empty");
export const newChatButton = $("#new-chat-button");
export const titleEl = $("#conversation-title");
export const metaEl = $("#conversation-meta");
export const statusEl = $("#connection-status");
export const scroller = $("#scroller");
export const messagesEl = $("#messages");
export const newChatPanel = $("#new-chat-panel");
export const collectionOptions = $("#collection-options");
export const profilePicker = $("#profile-picker");
export const profileSelect = $("#profile-select");
export const jumpButton = $("#jump-button");
export const composer = $("#composer");
export const input = $("#message-input");
export const sendButton = $("#send-button");
export const stopButton = $("#stop-button");
export const composerHint = $("#composer-hint");
export const charCounter = $("#char-counter");
export const toasts = $("#toasts");
export const logoutForm = $("#logout-form");
export const languageForm = $("#language-switch");
export const uploadPanel = $("#upload-panel");
export const uploadForm = $("#upload-form");
export const uploadFile = $("#upload-file");
export const uploadCollection = $("#upload-collection");
export const uploadHint = $("#upload-hint");
export const uploadButton = $("#upload-button");
export const uploadError = $("#upload-error");
export const uploadList = $("#upload-list");
export const DEFAULT_HINT = composerHint.textContent;

/** el("div", {class: "x", text: "hi", dataset: {a: 1}, onclick: fn, "aria-label": "…"}, ...children) */
export function el(tag, attrs, ...children) {
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
  thumbUp: ["M7 10v10H4V10z", "M7 10l4-7c1.4 0 2.4 1.1 2.1 2.5L12.6 9H19a2 2 0 0 1 2 2.3l-1.2 6.9A2.2 2.2 0 0 1 17.6 20H7"],
  thumbDown: ["M7 14V4H4v10z", "M7 14l4 7c1.4 0 2.4-1.1 2.1-2.5l-.5-3.5H19a2 2 0 0 0 2-2.3l-1.2-6.9A2.2 2.2 0 0 0 17.6 4H7"],
};

export function icon(name) {
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
