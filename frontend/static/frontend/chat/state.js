/*
 * The state that more than one module reads or writes, in one place. A module that alone uses a
 * piece of state keeps it private (the socket's reconnect timer, the conversation list); what is
 * shared is a field here, so every writer can be found with one search for `state.<field>`.
 */

export const state = {
  /** GET /chat/api/options/: collections, profiles, limits, upload; null until loaded. */
  options: null,
  /** The longest message the server accepts (from the options). */
  maxChars: Infinity,
  /** The conversation shown, null for a new chat. */
  currentId: null,
  /** The running turn (see turns.js `sendMessage`), null when none runs. */
  turn: null,
  /** The chat WebSocket is open (turns can be sent). */
  wsOpen: false,
  /** The socket has been open once: a drop after that reads "reconnecting", not "connecting". */
  everConnected: false,
  /** The page is going away (navigation, log-out): a closing socket is not an error then. */
  unloading: false,
};

/** Assistant bubble element -> {raw, sources, message}: the markdown behind what it shows. */
export const bubbles = new WeakMap();
