/*
 * Collections made from the upload panel (staff): the collection select ends with "New
 * collection…", which opens a small form (#new-collection: a name and the readers, users and
 * groups) that POSTs /chat/api/collections/. A first run has no collection: the select then
 * offers the server's suggestion ("General", in the page's language) and the form opens on it,
 * so the first document needs no trip to the admin. The panel's markup is only sent to staff.
 */

import { api } from "./api.js";
import { $, el, uploadButton, uploadCollection } from "./dom.js";
import { gettext, interpolate } from "./i18n.js";
import { state } from "./state.js";

const NEW = "new";
const form = $("#new-collection");
const nameInput = $("#new-collection-name");
const readerOptions = $("#new-collection-readers");
const createButton = $("#new-collection-create");
const errorBox = $("#new-collection-error");
// The collection to select once the options are loaded again (the one just made).
let wanted = null;

export function isNewCollection() {
  return uploadCollection.value === NEW;
}

function showError(message) {
  errorBox.hidden = !message;
  errorBox.textContent = message || "";
}

function readerBox(kind, id, label) {
  const box = el("input", { type: "checkbox", value: kind + ":" + id });
  return el("label", { class: "picker-option" }, box, el("span", { text: label }));
}

function renderReaders(upload) {
  const groups = (upload.reader_groups || []).map((g) => readerBox("group", g.id, interpolate(gettext("%(name)s (group)"), { name: g.name })));
  const users = (upload.readers || []).map((u) => readerBox("user", u.id, u.username));
  readerOptions.replaceChildren(...groups, ...users);
  if (!groups.length && !users.length) {
    readerOptions.append(el("p", { class: "hint", text: gettext("No other users yet: only staff will read it.") }));
  }
}

function showForm() {
  if (!form) return;
  form.hidden = !isNewCollection();
  uploadButton.disabled = isNewCollection();
}

/** Fills the select with the collections staff may fill, and the new-collection choice. */
export function renderCollectionChoice(upload) {
  const collections = upload.collections || [];
  const previous = wanted !== null ? String(wanted) : uploadCollection.value;
  wanted = null;
  const suggestion = upload.first_collection_name || "";
  const newLabel = suggestion ? interpolate(gettext("%(name)s (new)"), { name: suggestion }) : gettext("New collection…");
  uploadCollection.replaceChildren(
    ...collections.map((c) => el("option", { value: String(c.id), text: c.name })),
    el("option", { value: NEW, text: newLabel })
  );
  if (previous && Array.from(uploadCollection.options).some((option) => option.value === previous)) {
    uploadCollection.value = previous;
  }
  if (form) {
    renderReaders(upload);
    if (suggestion && !nameInput.value) nameInput.value = suggestion;
  }
  showForm();
}

function chosenReaders(kind) {
  return Array.from(readerOptions.querySelectorAll("input:checked"))
    .map((box) => box.value.split(":"))
    .filter(([boxKind]) => boxKind === kind)
    .map(([, id]) => parseInt(id, 10));
}

async function create(onCreated) {
  showError("");
  const name = nameInput.value.trim();
  if (!name) {
    showError(gettext("Name the collection."));
    nameInput.focus();
    return;
  }
  createButton.disabled = true;
  try {
    const body = { name, readers: chosenReaders("user"), reader_groups: chosenReaders("group") };
    const answer = await api("POST", "collections/", body);
    wanted = answer.collection.id;
    nameInput.value = "";
    const upload = state.options.upload;
    upload.collections = [...upload.collections, answer.collection].sort((a, b) => a.name.localeCompare(b.name));
    upload.first_collection_name = "";
    renderCollectionChoice(upload);
    onCreated(answer.collection);
  } catch (error) {
    showError(error.message);
  } finally {
    createButton.disabled = false;
  }
}

/** setUpNewCollection({onCreated(collection)}): wires the select and the form (staff pages). */
export function setUpNewCollection(handlers) {
  if (!form) return;
  uploadCollection.addEventListener("change", () => {
    showError("");
    showForm();
  });
  createButton.addEventListener("click", () => create(handlers.onCreated));
  nameInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      create(handlers.onCreated);
    }
  });
}
