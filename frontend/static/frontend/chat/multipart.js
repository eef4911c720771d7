/*
 * POST a multipart form to the JSON API with upload progress: XMLHttpRequest, not fetch, since
 * only it reports upload progress. Resolves with the JSON answer; rejects with an ApiError whose
 * message is the server's, or one in the page's language.
 */

import { ApiError, getCookie, goToLogin } from "./api.js";
import { config } from "./config.js";
import { formatNumber, gettext, interpolate } from "./i18n.js";
import { state } from "./state.js";

function errorMessage(status, data) {
  const message = data && data.error && data.error.message;
  if (message) return message;
  if (status === 413) {
    const limit = state.options && state.options.upload && state.options.upload.max_upload_mb;
    return limit
      ? interpolate(gettext("The file is too large (limit %(limit)s MB)."), { limit: formatNumber(limit) })
      : gettext("The file is too large.");
  }
  return interpolate(gettext("The upload failed (%(status)s)."), { status });
}

/** postMultipart("documents/", formData, {onProgress(fraction), onSent()}) -> the JSON answer. */
export function postMultipart(path, body, handlers) {
  const { onProgress, onSent } = handlers || {};
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", config.api_root + path);
    xhr.setRequestHeader("X-CSRFToken", getCookie("csrftoken"));
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable && onProgress) onProgress(event.loaded / event.total);
    });
    if (onSent) xhr.upload.addEventListener("load", () => onSent());
    xhr.addEventListener("load", () => {
      let data = null;
      try {
        data = JSON.parse(xhr.responseText);
      } catch (error) {
        data = null;
      }
      if (xhr.status >= 200 && xhr.status < 300) {
        if (data) resolve(data);
        else reject(new ApiError(xhr.status, "bad_response", gettext("The server sent an unreadable answer.")));
        return;
      }
      if (xhr.status === 401) goToLogin();
      const code = data && data.error ? data.error.code : "http_" + xhr.status;
      reject(new ApiError(xhr.status, code, errorMessage(xhr.status, data)));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, "network", gettext("The upload failed: could not reach the server."))));
    xhr.send(body);
  });
}
