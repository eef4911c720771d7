/* The sidebar as a drawer on phones (open, close, Escape, backdrop) and its log-out form. */

import { getCookie } from "./api.js";
import { config, PHONE } from "./config.js";
import { $, app, backdrop, logoutForm, menuButton, newChatButton } from "./dom.js";
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
    const field = logoutForm.querySelector("input[name=csrfmiddlewaretoken]");
    const token = getCookie("csrftoken");
    if (field && token) field.value = token;
  });
}
