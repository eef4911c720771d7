/* The JSON API under config.api_root: fetch with the CSRF token, errors as ApiError. */

import { config } from "./config.js";
import { gettext, interpolate } from "./i18n.js";
import { state } from "./state.js";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function getCookie(name) {
  const prefix = name + "=";
  for (const part of document.cookie ? document.cookie.split(";") : []) {
    const item = part.trim();
    if (item.startsWith(prefix)) return decodeURIComponent(item.slice(prefix.length));
  }
  return "";
}

function loginUrl() {
  return "/login/?next=" + encodeURIComponent(window.location.pathname);
}

export function goToLogin() {
  state.unloading = true;
  window.location.assign(loginUrl());
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
    const status = { status: response.status };
    message =
      response.status === 413
        ? gettext("The file is too large.")
        : response.status >= 500
          ? interpolate(gettext("The server had a problem (%(status)s). Please try again."), status)
          : interpolate(gettext("The request failed (%(status)s)."), status);
  }
  return new ApiError(response.status, code, message);
}

export async function api(method, path, body) {
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
    throw new ApiError(0, "network", gettext("Could not reach the server. Check your connection."));
  }
  if (response.redirected && new URL(response.url).pathname.startsWith("/login")) {
    goToLogin();
    throw new ApiError(401, "unauthenticated", gettext("Your session has ended; please log in again."));
  }
  if (response.status === 401) {
    goToLogin();
    throw new ApiError(401, "unauthenticated", gettext("Your session has ended; please log in again."));
  }
  if (!response.ok) throw await errorFrom(response);
  if (response.status === 204) return null;
  try {
    return await response.json();
  } catch (error) {
    throw new ApiError(response.status, "bad_response", gettext("The server sent an unreadable answer."));
  }
}
