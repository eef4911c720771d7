/*
 * The composer: the textarea that grows with its text, Send (disabled while offline, empty or
 * too long) and Stop (shown only while a turn runs), the hint line and the character counter.
 */

import {
  charCounter,
  composer,
  composerHint,
  DEFAULT_HINT,
  input,
  menuButton,
  messagesEl,
  sendButton,
  stopButton,
} from "./dom.js";
import { formatNumber, gettext } from "./i18n.js";
import { closeSidebar, isSidebarOpen } from "./sidebar.js";
import { wsSend } from "./socket.js";
import { state } from "./state.js";

export function autosize() {
  input.style.height = "auto";
  const max = Math.max(120, Math.round(window.innerHeight * 0.4));
  input.style.height = Math.min(input.scrollHeight, max) + "px";
  input.style.overflowY = input.scrollHeight > max ? "auto" : "hidden";
}

export function updateComposer() {
  const running = state.turn !== null;
  const length = input.value.length;
  const empty = input.value.trim() === "";
  const maxChars = state.maxChars;
  const over = length > maxChars;
  sendButton.hidden = running;
  stopButton.hidden = !running;
  sendButton.disabled = !state.wsOpen || running || empty || over;
  if (!state.wsOpen) {
    composerHint.textContent = state.everConnected
      ? gettext("Not connected: reconnecting… (what you type is kept)")
      : gettext("Connecting…");
    composerHint.classList.add("warn");
    composerHint.style.display = "inline";
    sendButton.title = gettext("Not connected");
  } else if (running) {
    composerHint.textContent = gettext("Answering… press Esc to stop");
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
    charCounter.textContent = formatNumber(length) + " / " + formatNumber(maxChars);
    charCounter.classList.toggle("warn", length >= maxChars * 0.9 && !over);
    charCounter.classList.toggle("over", over || length >= maxChars);
    charCounter.title = over ? gettext("Too long: shorten the message") : "";
  } else {
    charCounter.textContent = "";
    charCounter.className = "char-counter";
  }
  for (const button of messagesEl.querySelectorAll(".regenerate-button")) button.disabled = !state.wsOpen || running;
}

/** Asks the server to stop the running turn; its `done` frame (finish "stopped") ends it. */
export function stopTurn() {
  const turn = state.turn;
  if (!turn) return;
  if (turn.stopping) return;
  turn.stopping = true;
  wsSend({ type: "stop" });
  stopButton.disabled = true;
  setTimeout(() => (stopButton.disabled = false), 800);
}

/** `onSend()`: Enter (not Shift+Enter, not while an IME composes) or the Send button. */
export function setUpComposer({ onSend }) {
  input.addEventListener("input", () => {
    autosize();
    updateComposer();
  });

  input.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.isComposing || event.keyCode === 229) return; // IME composition: Enter picks a candidate
    event.preventDefault();
    onSend();
  });

  composer.addEventListener("submit", (event) => {
    event.preventDefault();
    onSend();
  });

  stopButton.addEventListener("click", () => {
    stopTurn();
    input.focus();
  });

  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.isComposing) return;
    if (isSidebarOpen()) {
      closeSidebar();
      menuButton.focus();
      return;
    }
    if (state.turn) {
      event.preventDefault();
      stopTurn();
    }
  });

  window.addEventListener("resize", autosize);
}
