/*
 * Staff upload: a file into a collection (POST /chat/api/documents/, with upload progress), then
 * its ingestion followed live over /ws/documents/<id>/progress/ until it is ready or failed.
 */

import { ApiError, getCookie, goToLogin } from "./api.js";
import { config, RECONNECT_MAX_MS, RECONNECT_MIN_MS } from "./config.js";
import {
  el,
  uploadButton,
  uploadCollection,
  uploadError,
  uploadFile,
  uploadForm,
  uploadHint,
  uploadList,
  uploadPanel,
} from "./dom.js";
import { wsUrl } from "./socket.js";
import { state } from "./state.js";
import { isNumber } from "./values.js";

const STATUS_LABELS = { uploading: "Uploading", queued: "Queued", processing: "Processing", ready: "Ready", failed: "Failed" };

/** Shows the panel to those the options allow to upload, with the collections they may fill. */
export function renderUploadPanel() {
  const upload = state.options && state.options.upload;
  if (!upload || !upload.allowed) {
    uploadPanel.hidden = true;
    return;
  }
  uploadPanel.hidden = false;
  uploadCollection.replaceChildren(...(upload.collections || []).map((c) => el("option", { value: String(c.id), text: c.name })));
  const noCollections = !(upload.collections || []).length;
  uploadButton.disabled = noCollections;
  uploadHint.textContent = noCollections
    ? "Create a collection in the admin first."
    : isNumber(upload.max_upload_mb) ? "Up to " + upload.max_upload_mb + " MB." : "";
}

function showUploadError(message) {
  uploadError.hidden = !message;
  uploadError.textContent = message || "";
}

function uploadItem(name) {
  const bar = el("div", { class: "progress-bar" });
  const status = el("span", { class: "upload-status", text: "Uploading…" });
  const item = el(
    "li",
    { class: "upload-progress", dataset: { status: "uploading" } },
    el("span", { class: "upload-name", text: name, title: name }),
    el("div", { class: "progress-track", role: "progressbar", "aria-label": "Progress of " + name, "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": "0" }, bar),
    status
  );
  uploadList.prepend(item);
  return item;
}

function showProgress(item, status, progress, error) {
  item.dataset.status = status;
  const pct = status === "ready" ? 100 : Math.max(0, Math.min(100, Math.round(progress || 0)));
  item.querySelector(".progress-bar").style.width = pct + "%";
  item.querySelector(".progress-track").setAttribute("aria-valuenow", String(pct));
  const label = STATUS_LABELS[status] || status;
  let text = label;
  if (status === "processing" || status === "uploading") text = label + " " + pct + "%";
  if (status === "failed") text = "Failed" + (error ? ": " + error : "");
  item.querySelector(".upload-status").textContent = text;
}

// NOTE: XMLHttpRequest, not fetch: only it reports upload progress.
function sendUpload(file, collection, item) {
  return new Promise((resolve, reject) => {
    const body = new FormData();
    body.append("file", file);
    body.append("collection", collection);
    const xhr = new XMLHttpRequest();
    xhr.open("POST", config.api_root + "documents/");
    xhr.setRequestHeader("X-CSRFToken", getCookie("csrftoken"));
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) showProgress(item, "uploading", (event.loaded / event.total) * 100);
    });
    xhr.addEventListener("load", () => {
      let data = null;
      try {
        data = JSON.parse(xhr.responseText);
      } catch (error) {
        data = null;
      }
      if (xhr.status === 201 || xhr.status === 200) {
        if (data && data.document) resolve(data.document);
        else reject(new ApiError(xhr.status, "bad_response", "The server sent an unreadable answer."));
        return;
      }
      if (xhr.status === 401) goToLogin();
      let message = data && data.error && data.error.message;
      if (!message) {
        const options = state.options;
        message = xhr.status === 413
          ? "The file is too large" + (options && options.upload && options.upload.max_upload_mb ? " (limit " + options.upload.max_upload_mb + " MB)." : ".")
          : "The upload failed (" + xhr.status + ").";
      }
      reject(new ApiError(xhr.status, data && data.error ? data.error.code : "http_" + xhr.status, message));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, "network", "The upload failed: could not reach the server.")));
    xhr.send(body);
  });
}

function watchDocument(documentId, item, attempt) {
  let finished = false;
  let socket;
  try {
    socket = new WebSocket(wsUrl("/ws/documents/" + documentId + "/progress/"));
  } catch (error) {
    showProgress(item, "failed", 0, "could not follow the progress");
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
    showProgress(item, row.status, row.progress, row.error);
    if (row.status === "ready" || row.status === "failed") {
      finished = true;
      socket.close();
      if (row.status === "ready") {
        const name = item.querySelector(".upload-name");
        const link = el("a", { class: "upload-name", href: "/documents/" + documentId + "/", target: "_blank", rel: "noopener", text: name.textContent, title: name.textContent });
        name.replaceWith(link);
      }
    }
  });
  socket.addEventListener("close", (event) => {
    if (finished || state.unloading) return;
    if (event.code === 4003 || event.code === 4004) {
      showProgress(item, "failed", 0, event.code === 4003 ? "not allowed to follow this document" : "the document was removed");
      return;
    }
    if ((attempt || 0) >= 6) {
      item.querySelector(".upload-status").textContent = "Progress unavailable (connection lost); check the admin.";
      return;
    }
    const delay = Math.min(RECONNECT_MAX_MS, RECONNECT_MIN_MS * 2 ** (attempt || 0));
    setTimeout(() => watchDocument(documentId, item, (attempt || 0) + 1), delay);
  });
}

export function setUpUpload() {
  uploadForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    showUploadError("");
    const file = uploadFile.files && uploadFile.files[0];
    if (!file) {
      showUploadError("Choose a file to upload.");
      uploadFile.focus();
      return;
    }
    if (!uploadCollection.value) {
      showUploadError("Choose a collection.");
      return;
    }
    const limit = state.options && state.options.upload && state.options.upload.max_upload_mb;
    if (isNumber(limit) && file.size > limit * 1024 * 1024) {
      showUploadError(file.name + " is larger than the " + limit + " MB limit.");
      return;
    }
    uploadButton.disabled = true;
    const item = uploadItem(file.name);
    try {
      const doc = await sendUpload(file, uploadCollection.value, item);
      item.dataset.documentId = String(doc.id);
      if (doc.title) {
        item.querySelector(".upload-name").textContent = doc.title;
      }
      showProgress(item, doc.status || "queued", 0, "");
      uploadForm.reset();
      if (doc.status !== "ready" && doc.status !== "failed") watchDocument(doc.id, item, 0);
    } catch (error) {
      item.remove();
      showUploadError(error.message);
    } finally {
      uploadButton.disabled = false;
    }
  });
}
