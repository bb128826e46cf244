// ringtrain's web page: the same API as curl, from the browser, same origin, no CDN. The token lives in
// sessionStorage (never in a URL); every view refreshes itself every two seconds while it is shown.

const TOKEN_KEY = "ringtrain.token";
const EXAMPLE = {
  name: "fashion-mnist-mlp",
  model: { name: "mlp", hidden: [64] },
  dataset: "fashion-mnist",
  train_samples: 2000,
  test_samples: 1000,
  workers: 1,
  per_worker_batch: 32,
  epochs: 1,
  lr: { base: 0.1, reference_batch: 64, warmup: { kind: "gradual", epochs: 0.5 } },
  optimizer: { momentum: 0.9 },
};

const $ = (id) => document.getElementById(id);
let current = { page: "signin", job: null, compare: [] };
const selected = new Set();
const COLOURS = ["#2f6fd6", "#d6532f", "#2fa36b", "#8a4fd6", "#c99a00", "#1aa3b8", "#d62f8a", "#5b6472"];
let timer = null;

/** A call to the API; a refusal becomes an Error with the problem's detail and field errors. */
async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY)}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = new Error(body && body.detail ? body.detail : `${response.status}`);
    error.status = response.status;
    error.fields = (body && body.errors) || [];
    throw error;
  }
  return body;
}

function show(page) {
  current.page = page;
  for (const id of ["signin", "jobs", "job", "submit", "compare", "cluster"]) $(id).hidden = id !== page;
  clearInterval(timer);
  const refresh = { jobs: renderJobs, job: renderJob, compare: renderCompare, cluster: renderCluster }[page];
  if (refresh) {
    refresh();
    timer = setInterval(refresh, 2000);
  }
}

function text(value) {
  return value === null || value === undefined ? "" : String(value);
}

function cell(row, value) {
  const td = document.createElement("td");
  td.textContent = text(value);
  row.appendChild(td);
  return td;
}

async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    const me = await api("/v1/me");
    $("whoami").textContent = `${me.role} of team ${me.team_name}${me.platform ? " (platform admin)" : ""}`;
    $("nav").hidden = false;
    $("signout").hidden = false;
    $("signin-error").textContent = "";
    show("jobs");
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("signin-error").textContent = `Not signed in: ${error.message}`;
  }
}

async function renderJobs() {
  const state = $("state-filter").value;
  const page = await api(`/v1/jobs?limit=100${state ? `&state=${state}` : ""}`);
  const rows = $("job-rows");
  rows.replaceChildren();
  for (const job of page.jobs) {
    const row = document.createElement("tr");
    const pick = document.createElement("input");
    pick.type = "checkbox";
    pick.checked = selected.has(job.id);
    pick.dataset.job = job.id;
    pick.setAttribute("aria-label", `compare ${job.name || job.id}`);
    pick.addEventListener("change", () => (pick.checked ? selected.add(job.id) : selected.delete(job.id)));
    row.appendChild(document.createElement("td")).appendChild(pick);
    const name = document.createElement("button");
    name.type = "button";
    name.textContent = job.name || job.id;
    name.dataset.job = job.id;
    name.addEventListener("click", () => openJob(job.id));
    row.appendChild(document.createElement("td")).appendChild(name);
    cell(row, job.state).className = "state";
    cell(row, `${job.workers} ${job.device}`);
    const waiting = job.pending_reason
      ? `${job.queue_position ? `#${job.queue_position}: ` : ""}${job.pending_reason.message}`
      : "";
    cell(row, waiting);
    cell(row, job.created_at.slice(0, 19).replace("T", " "));
    rows.appendChild(row);
  }
  $("no-jobs").hidden = page.jobs.length > 0;
}

function openJob(id) {
  current.job = id;
  show("job");
}

async function renderJob() {
  const id = current.job;
  const [job, events, logs, points] = await Promise.all([
    api(`/v1/jobs/${id}`),
    api(`/v1/jobs/${id}/events`),
    api(`/v1/jobs/${id}/logs?limit=200`),
    api(`/v1/jobs/${id}/metrics?kind=iteration&rank=0&name=loss&points=500&limit=10000`),
  ]);
  $("job-title").textContent = `Job ${job.name || job.id}`;
  const effective = job.effective || {};
  const facts = [
    ["State", job.state],
    ["Devices", `${job.workers} ${job.device}`],
    ["Global batch", effective.global_batch],
    ["Learning rate", `${effective.scaled_lr} (base ${effective.base_lr} for ${effective.reference_batch})`],
    ["Warmup iterations", effective.warmup_iterations],
    ["Attempt", `${job.attempt} (${job.preemptions} preemptions)`],
  ];
  if (job.pending_reason) facts.push(["Waiting", job.pending_reason.message]);
  if (job.estimated_start) facts.push(["Starts", job.estimated_start.basis]);
  if (job.result) facts.push(["Final test error", `${(job.result.final_test_error * 100).toFixed(2)}%`]);
  if (job.error) facts.push(["Error", job.error]);
  const list = $("job-facts");
  list.replaceChildren();
  for (const [name, value] of facts) {
    list.appendChild(document.createElement("dt")).textContent = name;
    const dd = list.appendChild(document.createElement("dd"));
    dd.textContent = text(value);
    if (name === "State") dd.id = "job-state";
  }
  $("cancel").hidden = ["succeeded", "failed", "cancelled"].includes(job.state);
  const eventList = $("job-events");
  eventList.replaceChildren();
  for (const event of events.events) {
    const at = event.at.slice(11, 19);
    eventList.appendChild(document.createElement("li")).textContent =
      `${at} ${event.to_state}${event.reason ? `: ${event.reason}` : ""}`;
  }
  $("job-logs").textContent = logs.lines.map((l) => `[rank ${l.rank}] ${l.line}`).join("\n");
  drawLine($("loss-chart"), points.points.map((p) => [p.iteration, p.fields.loss]));
}

/** The pool's nodes and devices, and the team's queued jobs in the scheduler's order with its reasons. */
async function renderCluster() {
  const [pool, queued] = await Promise.all([api("/v1/nodes"), api("/v1/jobs?state=queued&limit=500")]);
  const rows = $("node-rows");
  rows.replaceChildren();
  for (const node of pool.nodes) {
    const row = document.createElement("tr");
    cell(row, node.name);
    cell(row, node.state);
    cell(row, `${Math.round((Date.now() - Date.parse(node.last_heartbeat)) / 1000)} s ago`);
    const devices = node.devices.map((d) => {
      const memory = d.memory_bytes ? `, ${(d.memory_bytes / 2 ** 30).toFixed(0)} GiB` : "";
      return `${d.kind} ${d.index} (${d.name}${memory})`;
    });
    cell(row, devices.join("; "));
    rows.appendChild(row);
  }
  const waiting = queued.jobs
    .filter((job) => job.pending_reason)
    .sort((a, b) => a.device.localeCompare(b.device) || (a.queue_position ?? 1e9) - (b.queue_position ?? 1e9));
  const list = $("queue-rows");
  list.replaceChildren();
  for (const job of waiting) {
    const position = job.queue_position ? `#${job.queue_position} ${job.device}` : job.device;
    list.appendChild(document.createElement("li")).textContent =
      `${position}: ${job.name || job.id}: ${job.pending_reason.message}`;
  }
  $("queue-empty").hidden = waiting.length > 0;
}

/** 2 to 8 jobs side by side: their recipes, and their curves overlaid in one colour each. */
async function renderCompare() {
  const ids = current.compare;
  const jobs = await Promise.all(ids.map((id) => api(`/v1/jobs/${id}`)));
  const metrics = (id, kind, name) =>
    api(`/v1/jobs/${id}/metrics?kind=${kind}&rank=0&name=${name}&points=500&limit=10000`).then((p) => p.points);
  const [errors, losses, lrs] = await Promise.all([
    Promise.all(ids.map((id) => metrics(id, "epoch", "test_error"))),
    Promise.all(ids.map((id) => metrics(id, "iteration", "loss"))),
    Promise.all(ids.map((id) => metrics(id, "iteration", "lr"))),
  ]);
  const rows = $("compare-rows");
  rows.replaceChildren();
  jobs.forEach((job, i) => {
    const e = job.effective || {};
    const row = document.createElement("tr");
    const name = cell(row, job.name || job.id);
    name.style.color = COLOURS[i];
    for (const value of [e.workers, e.per_worker_batch, e.global_batch, e.scaled_lr, e.warmup_iterations, e.epochs]) {
      cell(row, value);
    }
    cell(row, job.result ? `${(job.result.final_test_error * 100).toFixed(2)}%` : job.state);
    rows.appendChild(row);
  });
  const series = (points, field, x) => points.map((p) => [p[x], p.fields[field]]);
  drawSeries($("compare-error-chart"), errors.map((p) => series(p, "test_error", "epoch")), "test error", "epoch");
  drawSeries($("compare-loss-chart"), losses.map((p) => series(p, "loss", "iteration")), "loss", "iteration");
  drawSeries($("compare-lr-chart"), lrs.map((p) => series(p, "lr", "iteration")), "lr", "iteration");
}

/** A line chart on a canvas: x and y scaled to the data, axes labelled with their ranges. */
function drawLine(canvas, data) {
  drawSeries(canvas, [data], "loss", "iteration");
}

/** Several lines on one canvas, one colour each, scaled together. */
function drawSeries(canvas, all, yName, xName) {
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  ctx.fillStyle = "#1d2430";
  ctx.font = "12px system-ui, sans-serif";
  const points = all.flat();
  if (points.length < 2) {
    ctx.fillText("nothing reported yet", 10, 20);
    return;
  }
  const xs = points.map((d) => d[0]);
  const ys = points.map((d) => d[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const pad = 40;
  const sx = (x) => pad + ((x - x0) / (x1 - x0 || 1)) * (width - 2 * pad);
  const sy = (y) => height - pad + ((y0 - y) / (y1 - y0 || 1)) * (height - 2 * pad);
  ctx.strokeStyle = "#98a2b3";
  ctx.lineWidth = 1;
  ctx.strokeRect(pad, pad, width - 2 * pad, height - 2 * pad);
  ctx.fillText(`${yName} ${y1.toPrecision(4)}`, 2, pad - 6);
  ctx.fillText(`${y0.toPrecision(4)}`, 2, height - pad + 14);
  ctx.fillText(`${xName} ${x0}`, pad, height - 8);
  ctx.fillText(`${x1}`, width - pad - 20, height - 8);
  all.forEach((data, i) => {
    ctx.strokeStyle = COLOURS[i % COLOURS.length];
    ctx.lineWidth = 2;
    ctx.beginPath();
    data.forEach(([x, y], j) => (j ? ctx.lineTo(sx(x), sy(y)) : ctx.moveTo(sx(x), sy(y))));
    ctx.stroke();
  });
}

function specFromEditor() {
  try {
    return JSON.parse($("spec").value);
  } catch (error) {
    throw Object.assign(new Error(`not JSON: ${error.message}`), { fields: [] });
  }
}

function showErrors(error) {
  $("verdict").textContent = error.message;
  const list = $("spec-errors");
  list.replaceChildren();
  for (const field of error.fields || []) {
    const item = list.appendChild(document.createElement("li"));
    item.dataset.path = field.path;
    item.textContent = `${field.path}: ${field.reason}`;
  }
}

async function check() {
  try {
    const answer = await api("/v1/jobs?dry_run=true", { method: "POST", body: JSON.stringify(specFromEditor()) });
    $("spec-errors").replaceChildren();
    $("verdict").textContent = `${answer.verdict}: ${answer.message}`;
  } catch (error) {
    showErrors(error);
  }
}

async function send() {
  try {
    const key = crypto.randomUUID();
    const job = await api("/v1/jobs", {
      method: "POST",
      body: JSON.stringify(specFromEditor()),
      headers: { "Idempotency-Key": key },
    });
    $("spec-errors").replaceChildren();
    $("verdict").textContent = `submitted ${job.id}`;
    openJob(job.id);
  } catch (error) {
    showErrors(error);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("spec").value = JSON.stringify(EXAMPLE, null, 2);
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim());
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  for (const button of document.querySelectorAll("#nav button")) {
    button.addEventListener("click", () => show(button.dataset.page));
  }
  $("state-filter").addEventListener("change", renderJobs);
  $("compare-selected").addEventListener("click", () => {
    const ids = [...selected];
    if (ids.length < 2 || ids.length > 8) {
      $("jobs-error").textContent = "Select 2 to 8 jobs to compare.";
      return;
    }
    $("jobs-error").textContent = "";
    current.compare = ids;
    show("compare");
  });
  $("cancel").addEventListener("click", async () => {
    await api(`/v1/jobs/${current.job}/cancel`, { method: "POST" });
    renderJob();
  });
  $("check").addEventListener("click", check);
  $("send").addEventListener("click", send);
  if (sessionStorage.getItem(TOKEN_KEY)) signIn(sessionStorage.getItem(TOKEN_KEY));
});
