// Small DOM helpers. Text is only ever set through textContent (never innerHTML): whatever a job's name or
// a rank's line holds is shown as text.

import { describe } from "./api.js";

export const $ = (id) => document.getElementById(id);

/** A value as text: nothing for null and undefined. */
export function text(value) {
  return value === null || value === undefined ? "" : String(value);
}

/** A new `tag` appended to `parent`, with `content` as its text when given. */
export function add(parent, tag, content) {
  const element = parent.appendChild(document.createElement(tag));
  if (content !== undefined) element.textContent = text(content);
  return element;
}

/** A table cell holding `value`, appended to `row`. */
export function cell(row, value) {
  return add(row, "td", value);
}

/** A button that calls `onClick`, with `data` as its data-* attributes. */
export function button(label, onClick, data = {}) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = label;
  Object.assign(element.dataset, data);
  element.addEventListener("click", onClick);
  return element;
}

export function percent(fraction, digits = 2) {
  return `${(fraction * 100).toFixed(digits)}%`;
}

/** An ISO time as "YYYY-MM-DD hh:mm:ss" (UTC), or nothing. */
export function clock(iso) {
  return iso ? iso.slice(0, 19).replace("T", " ") : "";
}

/**
 * Runs a user's action: `target` (the view's error line) is cleared first and shows the refusal if the
 * action fails, so no click ends in silence. Returns whether it succeeded.
 */
export async function act(target, action) {
  target.textContent = "";
  try {
    await action();
    return true;
  } catch (error) {
    target.textContent = describe(error);
    return false;
  }
}
