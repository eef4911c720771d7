/* The message list follows new text while the reader is at the bottom, and not once they scroll up. */

import { AT_BOTTOM_PX } from "./config.js";
import { jumpButton, messagesEl, scroller } from "./dom.js";

let stickToBottom = true;

function distanceFromBottom() {
  return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight;
}

export function scrollToBottom(force) {
  if (force) stickToBottom = true;
  if (stickToBottom) scroller.scrollTop = scroller.scrollHeight;
  updateJumpButton();
}

/** A new view starts at the bottom: new text is followed again (without scrolling now). */
export function followNewText() {
  stickToBottom = true;
  updateJumpButton();
}

export function updateJumpButton() {
  jumpButton.hidden = stickToBottom || distanceFromBottom() < AT_BOTTOM_PX || !messagesEl.childElementCount;
}

export function setUpScrolling() {
  scroller.addEventListener("scroll", () => {
    stickToBottom = distanceFromBottom() < AT_BOTTOM_PX;
    updateJumpButton();
  }, { passive: true });

  jumpButton.addEventListener("click", () => {
    stickToBottom = true;
    scroller.scrollTo({ top: scroller.scrollHeight, behavior: "smooth" });
    jumpButton.hidden = true;
  });
}
