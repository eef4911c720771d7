/* A new chat's options (GET /chat/api/options/): which collections to search, which profile. */

import { api } from "./api.js";
import { updateComposer } from "./composer.js";
import { $, collectionOptions, el, profilePicker, profileSelect } from "./dom.js";
import { gettext, interpolate } from "./i18n.js";
import { renderModelPicker } from "./model_picker.js";
import { state } from "./state.js";
import { toast } from "./toasts.js";
import { renderUploadPanel } from "./upload.js";
import { isNumber } from "./values.js";

export function selectedCollections() {
  return Array.from(collectionOptions.querySelectorAll("input[type=checkbox]:checked")).map((box) => parseInt(box.value, 10));
}

/** The header line of a chat just started: "profile · collection, collection". */
export function collectionNames(ids) {
  if (!state.options || !Array.isArray(ids)) return "";
  const names = state.options.collections.filter((c) => ids.includes(c.id)).map((c) => c.name);
  let profile = "";
  if (!profilePicker.hidden) {
    const option = profileSelect.selectedOptions[0];
    profile = option ? option.textContent : "";
  }
  return [profile, names.join(", ")].filter(Boolean).join(" · ");
}

function renderPickers() {
  const collections = (state.options && state.options.collections) || [];
  collectionOptions.replaceChildren();
  if (!collections.length) {
    collectionOptions.append(el("p", { class: "hint", text: gettext("No document collections are available to you yet; answers will not cite documents.") }));
  }
  for (const collection of collections) {
    const box = el("input", { type: "checkbox", value: String(collection.id), checked: true });
    collectionOptions.append(el("label", { class: "picker-option" }, box, el("span", { text: collection.name })));
  }
  $("#collections-all").hidden = $("#collections-none").hidden = collections.length < 2;
  const profiles = (state.options && state.options.profiles) || [];
  profileSelect.replaceChildren(
    ...profiles.map((p) => el("option", { value: String(p.id), selected: p.is_default, text: p.name }))
  );
  profilePicker.hidden = profiles.length < 2;
}

/** Loads the options (retried a few times: the page works without them, but cites nothing). */
export async function loadOptions(attempt) {
  try {
    state.options = await api("GET", "options/");
  } catch (error) {
    if (error.status === 401) return;
    if ((attempt || 0) < 4) setTimeout(() => loadOptions((attempt || 0) + 1), 1500 * ((attempt || 0) + 1));
    else toast(interpolate(gettext("Could not load the chat options: %(error)s"), { error: error.message }));
    return;
  }
  state.maxChars = isNumber(state.options.max_message_chars) ? state.options.max_message_chars : Infinity;
  renderPickers();
  renderModelPicker();
  renderUploadPanel();
  updateComposer();
}

export function setUpOptions() {
  $("#collections-all").addEventListener("click", () => {
    for (const box of collectionOptions.querySelectorAll("input[type=checkbox]")) box.checked = true;
    updateComposer();
  });
  $("#collections-none").addEventListener("click", () => {
    for (const box of collectionOptions.querySelectorAll("input[type=checkbox]")) box.checked = false;
    updateComposer();
  });
  collectionOptions.addEventListener("change", updateComposer);
}
