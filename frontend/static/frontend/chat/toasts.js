/* Short notices in the corner: errors stay 8 s, info 3.5 s, at most three at a time. */

import { el, icon, toasts } from "./dom.js";
import { gettext } from "./i18n.js";

export function toast(message, kind) {
  const close = el("button", { type: "button", class: "icon-button", "aria-label": gettext("Dismiss") }, icon("close"));
  const node = el(
    "div",
    { class: "toast " + (kind === "info" ? "info" : "error-message"), role: kind === "info" ? "status" : "alert" },
    el("p", { text: message }),
    close
  );
  const dismiss = () => node.remove();
  close.addEventListener("click", dismiss);
  toasts.append(node);
  while (toasts.children.length > 3) toasts.firstElementChild.remove();
  setTimeout(dismiss, kind === "info" ? 3500 : 8000);
  return node;
}
