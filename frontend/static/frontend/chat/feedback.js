/*
 * Feedback on answers: thumbs up / down on every saved answer, and an optional note that opens
 * after a thumb. Saved with PUT /chat/api/messages/<id>/feedback/ (the owner's own answers
 * only), cleared with DELETE by pressing the pressed thumb again; the conversation's JSON
 * brings it back after a reload (message.feedback).
 *
 * Hooks for the browser tests: .feedback[data-rating] > .feedback-button[data-rating]
 * (aria-pressed), .feedback-status; .feedback-note (textarea, .feedback-save).
 */

import { api } from "./api.js";
import { el, icon, messagesEl } from "./dom.js";
import { gettext } from "./i18n.js";

const NOTE_MAX_CHARS = 1000;
const BUTTONS = {
  up: () => [gettext("Good answer"), "thumbUp"],
  down: () => [gettext("Bad answer"), "thumbDown"],
};

/** The thumbs of a saved answer (`message`: the protocol's Message, with `feedback`). */
export function feedbackButtons(message) {
  const rating = message.feedback ? message.feedback.rating : "";
  return el(
    "div",
    { class: "feedback", role: "group", "aria-label": gettext("Rate this answer"), dataset: { rating } },
    ...Object.entries(BUTTONS).map(([value, describe]) => {
      const [label, iconName] = describe();
      return el(
        "button",
        {
          type: "button",
          class: "action-button feedback-button",
          dataset: { rating: value },
          "aria-pressed": String(rating === value),
          "aria-label": label,
          title: label,
        },
        icon(iconName)
      );
    }),
    el("span", { class: "feedback-status", role: "status" })
  );
}

/** The note form under an answer: shown when a thumb is pressed and, after a reload, where a
 * note was saved (a long chat of rated answers stays uncluttered). */
export function feedbackNote(message) {
  const feedback = message.feedback;
  const id = "feedback-note-" + message.id;
  const textarea = el("textarea", { id, rows: "2", maxlength: String(NOTE_MAX_CHARS), placeholder: gettext("What was good or wrong about it?") });
  textarea.value = feedback ? feedback.note || "" : "";
  return el(
    "form",
    { class: "feedback-note", hidden: !(feedback && feedback.note) },
    el("label", { for: id, text: gettext("Add a note (optional)") }),
    textarea,
    el("div", { class: "feedback-note-actions" }, el("button", { type: "submit", class: "button feedback-save", text: gettext("Save note") }))
  );
}

function partsOf(bubble) {
  return {
    group: bubble.querySelector(".feedback"),
    form: bubble.querySelector(".feedback-note"),
    status: bubble.querySelector(".feedback-status"),
  };
}

function show(bubble, feedback) {
  const { group, form } = partsOf(bubble);
  const rating = feedback ? feedback.rating : "";
  group.dataset.rating = rating;
  for (const button of group.querySelectorAll(".feedback-button")) {
    button.setAttribute("aria-pressed", String(button.dataset.rating === rating));
  }
  form.hidden = !feedback;
  if (!feedback) form.querySelector("textarea").value = "";
}

async function save(bubble, rating, note) {
  const { status } = partsOf(bubble);
  const path = "messages/" + bubble.dataset.messageId + "/feedback/";
  status.textContent = "";
  status.classList.remove("failed");
  try {
    if (rating) {
      const data = await api("PUT", path, { rating, note });
      show(bubble, data.feedback);
      return data.feedback;
    }
    await api("DELETE", path);
    show(bubble, null);
    return null;
  } catch (error) {
    status.classList.add("failed");
    status.textContent = error.message;
    return undefined;
  }
}

export function setUpFeedback() {
  messagesEl.addEventListener("click", async (event) => {
    const button = event.target.closest(".feedback-button");
    if (!button) return;
    const bubble = button.closest(".message.assistant");
    if (!bubble || !bubble.dataset.messageId) return;
    const pressed = button.getAttribute("aria-pressed") === "true";
    const { form, status } = partsOf(bubble);
    const note = form.querySelector("textarea").value.trim();
    const saved = await save(bubble, pressed ? "" : button.dataset.rating, note);
    if (saved === undefined) return;
    status.textContent = saved ? gettext("Thanks for the feedback.") : gettext("Rating cleared.");
    if (saved && !note) form.querySelector("textarea").focus();
  });
  messagesEl.addEventListener("submit", async (event) => {
    const form = event.target.closest(".feedback-note");
    if (!form) return;
    event.preventDefault();
    const bubble = form.closest(".message.assistant");
    const rating = partsOf(bubble).group.dataset.rating;
    if (!rating) return;
    const saved = await save(bubble, rating, form.querySelector("textarea").value.trim());
    if (saved) partsOf(bubble).status.textContent = gettext("Note saved.");
  });
}
