/*
 * A document's ingestion followed live over /ws/documents/<id>/progress/ (staff only): every
 * `document.progress` row goes to `onRow` until the document is finished; a dropped socket is
 * opened again with backoff. `onStop(reason)` says why following ended early: "forbidden"
 * (4003), "gone" (4004, the document was deleted) or "lost" (the connection, after retries).
 */

import { RECONNECT_MAX_MS, RECONNECT_MIN_MS } from "./config.js";
import { wsUrl } from "./socket.js";
import { state } from "./state.js";

export const FINISHED_STATUSES = new Set(["ready", "failed", "cancelled"]);
const MAX_ATTEMPTS = 6;

/** followDocument(id, {onRow(row), onStop(reason)}) -> {close()}. */
export function followDocument(documentId, handlers) {
  let stopped = false;
  let socket = null;
  let timer = null;

  function open(attempt) {
    try {
      socket = new WebSocket(wsUrl("/ws/documents/" + documentId + "/progress/"));
    } catch (error) {
      handlers.onStop("lost");
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
      handlers.onRow(row);
      if (FINISHED_STATUSES.has(row.status)) {
        stopped = true;
        socket.close();
      }
    });
    socket.addEventListener("close", (event) => {
      if (stopped || state.unloading) return;
      if (event.code === 4003 || event.code === 4004) {
        handlers.onStop(event.code === 4003 ? "forbidden" : "gone");
        return;
      }
      if (attempt >= MAX_ATTEMPTS) {
        handlers.onStop("lost");
        return;
      }
      const delay = Math.min(RECONNECT_MAX_MS, RECONNECT_MIN_MS * 2 ** attempt);
      timer = setTimeout(() => open(attempt + 1), delay);
    });
  }

  open(0);
  return {
    close() {
      stopped = true;
      clearTimeout(timer);
      if (socket) socket.close();
    },
  };
}
