/* Checks on values the server sends, before the UI shows them or links to them. */

export function isNumber(value) {
  return typeof value === "number" && Number.isFinite(value);
}

/** Only same-origin paths and http(s) URLs become links. */
export function safeUrl(url) {
  if (typeof url !== "string") return null;
  if (url.startsWith("/") && !url.startsWith("//")) return url;
  if (/^https?:\/\//i.test(url)) return url;
  return null;
}
