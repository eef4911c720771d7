/*
 * The model picker (shown only when more than one model is on offer: the in-process engine's
 * and enabled remote backends', GET /chat/api/options/ `models`). Its choice goes in each turn's
 * `model` field (docs/chat-protocol.md); "Automatic" sends none, so the routing rules choose.
 */

import { $, el } from "./dom.js";
import { gettext, interpolate } from "./i18n.js";
import { state } from "./state.js";

const AUTOMATIC = "auto";
const picker = $("#model-picker");
const select = $("#model-select");

/** Fills the picker from the loaded options, keeping the choice when it is still offered. */
export function renderModelPicker() {
  const models = (state.options && state.options.models) || [];
  const previous = select.value;
  select.replaceChildren(
    el("option", { value: AUTOMATIC, text: gettext("Automatic (routing rules)") }),
    ...models.map((model) =>
      el("option", {
        value: model.name,
        text: model.is_local ? interpolate(gettext("%(name)s (this server)"), { name: model.name }) : model.name,
      })
    )
  );
  if (models.some((model) => model.name === previous)) select.value = previous;
  picker.hidden = models.length < 2;
  // each answer's model (.answer-model) shows only then: with one model it says nothing new
  document.body.classList.toggle("several-models", !picker.hidden);
}

/** The model the next turn asks for, or null: the server's routing rules choose. */
export function chosenModel() {
  if (picker.hidden || !select.value || select.value === AUTOMATIC) return null;
  return select.value;
}
