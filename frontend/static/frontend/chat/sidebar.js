/* The sidebar as a drawer on phones (open, close, Escape, backdrop) and its log-out form. */

import { getCookie } from "./api.js";
import { config, PHONE } from "./config.js";
import { $, app, backdrop, languageForm, logoutForm, menuButton, newChatButton } from "./dom.js";
import { state } from "./state.js";

export function isSidebarOpen() {
  return app.classList.contains("sidebar-open");
}

function openSidebar() {
  app.classList.add("sidebar-open");
  backdrop.hidden = false;
  menuButton.setAttribute("aria-expanded", "true");
  newChatButton.focus();
}

export function closeSidebar() {
  if (!isSidebarOpen()) return;
  app.classList.remove("sidebar-open");
  backdrop.hidden = true;
  menuButton.setAttribute("aria-expanded", "false");
}

export function setUpSidebar() {
  menuButton.addEventListener("click", () => (isSidebarOpen() ? closeSidebar() : openSidebar()));
  backdrop.addEventListener("click", closeSidebar);
  $("#sidebar-close").addEventListener("click", () => {
    closeSidebar();
    menuButton.focus();
  });
  PHONE.addEventListener("change", () => {
    if (!PHONE.matches) closeSidebar();
  });

  logoutForm.action = config.logout_url;
  logoutForm.addEventListener("submit", () => {
    state.unloading = true;
    refreshCsrfToken(logoutForm);
  });
  // The language switch comes back to the conversation shown now, not the one the page opened on.
  languageForm.addEventListener("submit", () => {
    state.unloading = true;
    refreshCsrfToken(languageForm);
    languageForm.elements.next.value = window.location.pathname;
  });
}

/** The page may be older than the CSRF cookie (a log-in elsewhere rotates it): post the cookie's. */
function refreshCsrfToken(form) {
  const field = form.querySelector("input[name=csrfmiddlewaretoken]");
  const token = getCookie("csrftoken");
  if (field && token) field.value = token;
}
