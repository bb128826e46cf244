// The API, as the page calls it: same origin, the token from sessionStorage as a bearer token (never in a
// URL), and a refusal (problem+json) turned into an Error carrying the problem's detail and field errors.

export const TOKEN_KEY = "ringtrain.token";

/** Since when the server has not answered (null while it answers), and who wants to know. */
let lostSince = null;
const contactListeners = [];

/** Calls `listener(lostSince)` whenever contact with the server is lost (a Date) or back (null). */
export function onContact(listener) {
  contactListeners.push(listener);
}

function contact(lost) {
  if ((lostSince !== null) === lost) return;
  lostSince = lost ? new Date() : null;
  for (const listener of contactListeners) listener(lostSince);
}

/** A plain fetch with the token; the body, when there is one, is JSON. A call that reaches no server (the
 * fetch itself fails, or a proxy in front answers 502 or 504) marks contact lost until one is answered. */
export async function request(path, options = {}) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY)}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, { ...options, headers });
  } catch (error) {
    contact(true);
    throw new Error(`the server cannot be reached (${error.message})`);
  }
  contact(response.status === 502 || response.status === 504);
  return response;
}

/** The Error for a refused response: `message` is the problem's detail, `fields` its field errors. */
export async function refusal(response) {
  let body = null;
  try {
    const text = await response.text();
    body = text ? JSON.parse(text) : null;
  } catch {
    // not problem+json (a proxy's page, say): the status alone
  }
  const error = new Error((body && (body.detail || body.title)) || `${response.status}`);
  error.status = response.status;
  error.fields = (body && body.errors) || [];
  return error;
}

/** A call to the API: its JSON answer, or a refusal thrown (see `refusal`). */
export async function api(path, options = {}) {
  const response = await request(path, options);
  if (!response.ok) throw await refusal(response);
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

/** An error as one line for the user: the detail, then each field error as "path: reason". */
export function describe(error) {
  const fields = (error.fields || []).map((f) => `${f.path}: ${f.reason}`).join("; ");
  return `${error.message}${fields ? ` (${fields})` : ""}`;
}

/** One metric of a job's rank, thinned by the server to at most 1000 points. */
export function metricsOf(id, kind, name, rank = 0) {
  return api(`/v1/jobs/${id}/metrics?kind=${kind}&rank=${rank}&name=${name}&points=1000&limit=10000`).then(
    (page) => page.points,
  );
}
