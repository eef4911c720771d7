/* The page's configuration (the view's `chat-config` JSON) and the UI's fixed tunings. */

function readJson(id) {
  const node = document.getElementById(id);
  if (!node) return null;
  try {
    return JSON.parse(node.textContent);
  } catch (error) {
    return null;
  }
}

export const config = Object.assign(
  { conversation_id: null, ws_path: "/ws/chat/", api_root: "/chat/api/", logout_url: "/logout/" },
  readJson("chat-config") || {}
);
if (!config.api_root.endsWith("/")) config.api_root += "/";

export const RECONNECT_MIN_MS = 500;
export const RECONNECT_MAX_MS = 10000;
export const PING_INTERVAL_MS = 30000;
export const SNIPPET_CHARS = 300;
export const AT_BOTTOM_PX = 80;
export const PHONE = window.matchMedia("(max-width: 640px)");
