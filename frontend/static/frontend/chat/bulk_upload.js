/*
 * Bulk upload (staff): a folder (<input webkitdirectory>) or several files and zips at once into
 * the chosen collection, POSTed to /chat/api/documents/bulk/ in batches (each file's relative
 * path beside it), with one result per file: queued, or skipped with the server's reason. The
 * ingestion queue then shows their progress.
 */

import { $, el, uploadCollection } from "./dom.js";
import { formatPercent, gettext, interpolate, ngettext } from "./i18n.js";
import { postMultipart } from "./multipart.js";
import { isNewCollection } from "./new_collection.js";
import { statusLabel } from "./upload.js";

// Files per request: a large folder goes as several requests, each a bounded body.
const FILES_PER_REQUEST = 50;
const form = $("#bulk-upload");
const folderInput = $("#bulk-folder");
const filesInput = $("#bulk-files");
const button = $("#bulk-button");
const status = $("#bulk-status");
const results = $("#bulk-results");

function chosenFiles() {
  return [...Array.from(folderInput.files || []), ...Array.from(filesInput.files || [])];
}

function showResult(result) {
  const queued = Boolean(result.document);
  // NOTE: with tasks run in-process the answer comes after the ingestion: show where it stands.
  const text = queued ? statusLabel(result.document.status) : interpolate(gettext("Skipped: %(reason)s"), { reason: result.skipped });
  results.append(
    el(
      "li",
      { class: "bulk-result", dataset: { outcome: queued ? "queued" : "skipped" } },
      el("span", { class: "bulk-name", text: result.name, title: result.name }),
      el("span", { class: "bulk-outcome", text })
    )
  );
}

function batchesOf(files) {
  const batches = [];
  for (let start = 0; start < files.length; start += FILES_PER_REQUEST) batches.push(files.slice(start, start + FILES_PER_REQUEST));
  return batches;
}

async function sendBatch(files, collection, onSent) {
  const body = new FormData();
  body.append("collection", collection);
  for (const file of files) {
    body.append("file", file);
    body.append("path", file.webkitRelativePath || file.name);
  }
  const onProgress = (fraction) => {
    status.textContent = interpolate(gettext("Uploading… %(percent)s"), { percent: formatPercent(fraction) });
  };
  return postMultipart("documents/bulk/", body, { onProgress, onSent });
}

async function upload(onSent) {
  const files = chosenFiles();
  if (!files.length) {
    status.textContent = gettext("Choose a folder, files or a zip first.");
    return;
  }
  if (!uploadCollection.value || isNewCollection()) {
    status.textContent = gettext("Create the collection first.");
    return;
  }
  button.disabled = true;
  results.replaceChildren();
  let queued = 0;
  let skipped = 0;
  try {
    for (const batch of batchesOf(files)) {
      const answer = await sendBatch(batch, uploadCollection.value, onSent);
      for (const result of answer.results || []) {
        showResult(result);
        if (result.document) queued += 1;
        else skipped += 1;
      }
    }
    folderInput.value = "";
    filesInput.value = "";
    status.textContent = [
      interpolate(ngettext("%(count)s file queued", "%(count)s files queued", queued), { count: queued }),
      interpolate(ngettext("%(count)s skipped", "%(count)s skipped", skipped), { count: skipped }),
    ].join(" · ");
  } catch (error) {
    status.textContent = error.message;
  } finally {
    button.disabled = false;
  }
}

/** setUpBulkUpload({onSent()}): `onSent` runs once a batch's bytes are at the server. */
export function setUpBulkUpload(handlers) {
  if (!form) return;
  button.addEventListener("click", () => upload(handlers.onSent));
}
