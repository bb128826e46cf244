// Small DOM helpers. Text is only ever set through textContent (never innerHTML): whatever a job's name or
// a rank's line holds is shown as text.

import { api, describe } from "./api.js";

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

/** `45 s`, `2 min 31 s`, `3 h 05 min`. */
export function duration(seconds) {
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${String(seconds % 60).padStart(2, "0")} s`;
  return `${Math.floor(seconds / 3600)} h ${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")} min`;
}

/** A link to a job's page (`#/jobs/ID`), named by `name` (or the start of its id until the name is known). */
export function jobLink(id, name) {
  const link = document.createElement("a");
  link.href = `#/jobs/${id}`;
  link.dataset.job = id;
  link.textContent = name || id.slice(0, 8);
  return link;
}

/** The names of jobs met in texts, by id (a promise each: asked once). */
const jobNames = new Map();

function jobName(id) {
  if (!jobNames.has(id)) {
    jobNames.set(
      id,
      api(`/v1/jobs/${id}`).then(
        (job) => job.name || id.slice(0, 8),
        () => id.slice(0, 8),
      ),
    );
  }
  return jobNames.get(id);
}

const JOB_IN_TEXT = /\bjob ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\b/g;

/**
 * Sets `element`'s text to `text`, with every "job <id>" in it (a queue reason's blocking jobs, an event's
 * preemptor) a link to that job's page, named by the job's name once it is known.
 */
export function linkedText(element, text) {
  element.replaceChildren();
  let at = 0;
  for (const match of text.matchAll(JOB_IN_TEXT)) {
    element.append(text.slice(at, match.index), "job ");
    const id = match[1];
    const link = element.appendChild(jobLink(id));
    jobName(id).then((name) => (link.textContent = name));
    at = match.index + match[0].length;
  }
  element.append(text.slice(at));
}
