/* Copy to the clipboard, with a fallback where the Clipboard API is missing (plain http). */

import { el } from "./dom.js";
import { gettext } from "./i18n.js";

export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch (error) {
      /* fall back below */
    }
  }
  const focused = document.activeElement;
  const area = el("textarea", { readonly: true, "aria-hidden": "true" });
  area.value = text;
  area.style.cssText = "position:fixed;top:0;left:0;width:1px;height:1px;opacity:0;";
  document.body.append(area);
  area.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch (error) {
    ok = false;
  }
  area.remove();
  if (focused && typeof focused.focus === "function") focused.focus({ preventScroll: true });
  return ok;
}

export function flashCopied(button, ok) {
  const label = button.querySelector(".label") || button;
  if (!button.dataset.label) button.dataset.label = label.textContent;
  label.textContent = ok ? gettext("Copied") : gettext("Copy failed");
  button.classList.toggle("copied", ok);
  clearTimeout(button._copyTimer);
  button._copyTimer = setTimeout(() => {
    label.textContent = button.dataset.label;
    button.classList.remove("copied");
  }, 1600);
}
