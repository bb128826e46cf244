// The API, as the page calls it: same origin, the token from sessionStorage as a bearer token (never in a
// URL), and a refusal (problem+json) turned into an Error carrying the problem's detail and field errors.

export const TOKEN_KEY = "ringtrain.token";

/** A plain fetch with the token; the body, when there is one, is JSON. */
export function request(path, options = {}) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY)}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  return fetch(path, { ...options, headers });
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
