/* el(): the staff pages' one element builder (the chat's, in chat/dom.js, also wires events). */

/** el("td", {class: "x", text: "…", "data-metric": "f1"}, ...children): null attributes and
 * children are left out; text is set as text, never as markup. */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else node.setAttribute(key, String(value));
  }
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}
