/*
 * The page's language: text through Django's JavaScript catalog (chat.html loads it, a classic
 * script, before the modules; if it failed to load, the English text shows), numbers and dates
 * formatted for the language of the page (<html lang>, the language Django chose).
 *
 * Text must be a string literal in each call (gettext("..."), not gettext(name)): makemessages
 * finds the strings to translate by those calls. Placeholders are named: "%(count)s tokens".
 */

export const LANGUAGE = document.documentElement.lang || "en";

export function gettext(text) {
  return typeof window.gettext === "function" ? window.gettext(text) : text;
}

export function ngettext(singular, plural, count) {
  if (typeof window.ngettext === "function") return window.ngettext(singular, plural, count);
  return count === 1 ? singular : plural;
}

export function pgettext(context, text) {
  return typeof window.pgettext === "function" ? window.pgettext(context, text) : text;
}

/** interpolate("%(count)s tokens", {count: 3}): the catalog's, named placeholders. */
export function interpolate(format, values) {
  if (typeof window.interpolate === "function") return window.interpolate(format, values, true);
  return format.replace(/%\((\w+)\)s/g, (match, name) => String(values[name]));
}

function formatter(make) {
  try {
    return make(LANGUAGE);
  } catch (error) {
    return make(undefined); // a language tag Intl does not know: the browser's own
  }
}

const numberFormats = new Map();

/** A number in the page's language: `digits` fraction digits (default none, grouped). */
export function formatNumber(value, digits) {
  const key = digits || 0;
  if (!numberFormats.has(key)) {
    const options = { minimumFractionDigits: key, maximumFractionDigits: key };
    numberFormats.set(key, formatter((language) => new Intl.NumberFormat(language, options)));
  }
  return numberFormats.get(key).format(value);
}

const percentFormat = formatter((language) => new Intl.NumberFormat(language, { style: "percent" }));

/** A fraction (0.45) as a percentage ("45%") in the page's language. */
export function formatPercent(fraction) {
  return percentFormat.format(fraction);
}

const dateTimeFormat = formatter(
  (language) => new Intl.DateTimeFormat(language, { dateStyle: "medium", timeStyle: "short" })
);

/** A date and time (a Date or an ISO string) in the page's language. */
export function formatDateTime(value) {
  const date = value instanceof Date ? value : new Date(value);
  return Number.isNaN(date.getTime()) ? "" : dateTimeFormat.format(date);
}
