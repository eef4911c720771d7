/*
 * Staff upload: a file into a collection (POST /chat/api/documents/, with upload progress), then
 * its ingestion followed live over /ws/documents/<id>/progress/ until it is ready, failed or
 * cancelled. The collection is chosen, or made, by new_collection.js.
 */

import { ApiError } from "./api.js";
import { FINISHED_STATUSES, followDocument } from "./document_progress.js";
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
import { formatNumber, formatPercent, gettext, interpolate } from "./i18n.js";
import { postMultipart } from "./multipart.js";
import { isNewCollection, renderCollectionChoice } from "./new_collection.js";
import { state } from "./state.js";
import { isNumber } from "./values.js";

/** A document's status as shown; read when shown, in the page's language. */
export function statusLabel(status) {
  const labels = {
    uploading: gettext("Uploading"),
    queued: gettext("Queued"),
    processing: gettext("Processing"),
    ready: gettext("Ready"),
    failed: gettext("Failed"),
    cancelled: gettext("Cancelled"),
  };
  return labels[status] || status;
}

/** Shows the panel to those the options allow to upload, with the collections they may fill. */
export function renderUploadPanel() {
  const upload = state.options && state.options.upload;
  if (!upload || !upload.allowed) {
    uploadPanel.hidden = true;
    return;
  }
  uploadPanel.hidden = false;
  renderCollectionChoice(upload);
  uploadHint.textContent = isNumber(upload.max_upload_mb) ? interpolate(gettext("Up to %(limit)s MB."), { limit: formatNumber(upload.max_upload_mb) }) : "";
}

function showUploadError(message) {
  uploadError.hidden = !message;
  uploadError.textContent = message || "";
}

function uploadItem(name) {
  const bar = el("div", { class: "progress-bar" });
  const status = el("span", { class: "upload-status", text: gettext("Uploading…") });
  const item = el(
    "li",
    { class: "upload-progress", dataset: { status: "uploading" } },
    el("span", { class: "upload-name", text: name, title: name }),
    el("div", { class: "progress-track", role: "progressbar", "aria-label": interpolate(gettext("Progress of %(name)s"), { name }), "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": "0" }, bar),
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
  let text = statusLabel(status);
  if (status === "processing" || status === "uploading") {
    text += " " + formatPercent(pct / 100);
  }
  if (status === "failed" && error) text = interpolate(gettext("Failed: %(error)s"), { error });
  item.querySelector(".upload-status").textContent = text;
}

function sendUpload(file, collection, item) {
  const body = new FormData();
  body.append("file", file);
  body.append("collection", collection);
  const onProgress = (fraction) => showProgress(item, "uploading", fraction * 100);
  return postMultipart("documents/", body, { onProgress }).then((data) => {
    if (data.document) return data.document;
    throw new ApiError(200, "bad_response", gettext("The server sent an unreadable answer."));
  });
}

function watchDocument(documentId, item) {
  followDocument(documentId, {
    onRow(row) {
      showProgress(item, row.status, row.progress, row.error);
      if (row.status === "ready") {
        const name = item.querySelector(".upload-name");
        const link = el("a", { class: "upload-name", href: "/documents/" + documentId + "/", target: "_blank", rel: "noopener", text: name.textContent, title: name.textContent });
        name.replaceWith(link);
      }
    },
    onStop(reason) {
      if (reason === "lost") {
        item.querySelector(".upload-status").textContent = gettext("Progress unavailable (connection lost); check the admin.");
        return;
      }
      showProgress(item, "failed", 0, reason === "forbidden" ? gettext("not allowed to follow this document") : gettext("the document was removed"));
    },
  });
}

export function setUpUpload() {
  uploadForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    showUploadError("");
    const file = uploadFile.files && uploadFile.files[0];
    if (!file) {
      showUploadError(gettext("Choose a file to upload."));
      uploadFile.focus();
      return;
    }
    if (!uploadCollection.value || isNewCollection()) {
      showUploadError(isNewCollection() ? gettext("Create the collection first.") : gettext("Choose a collection."));
      return;
    }
    const limit = state.options && state.options.upload && state.options.upload.max_upload_mb;
    if (isNumber(limit) && file.size > limit * 1024 * 1024) {
      showUploadError(interpolate(gettext("%(name)s is larger than the %(limit)s MB limit."), { name: file.name, limit: formatNumber(limit) }));
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
      if (!FINISHED_STATUSES.has(doc.status)) watchDocument(doc.id, item);
    } catch (error) {
      item.remove();
      showUploadError(error.message);
    } finally {
      uploadButton.disabled = false;
    }
  });
}
