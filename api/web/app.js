// ringtrain's web page: the same API as curl, from the browser, same origin, no CDN. The token lives in
// sessionStorage (never in a URL); every view refreshes itself every two seconds while it is shown.

import { COLOURS, drawChart, plannedLr } from "/web/charts.js";

const TOKEN_KEY = "ringtrain.token";
const BASE = {
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
/** Specs to start from in the editor. */
const EXAMPLES = {
  "Fashion-MNIST, an MLP, one worker": { name: "fashion-mnist-mlp", ...BASE },
  "Fashion-MNIST, LeNet-5 on 2 workers, gradual warmup": {
    ...BASE,
    name: "fashion-mnist-lenet",
    model: { name: "lenet5" },
    train_samples: 10000,
    workers: 2,
    epochs: 3,
    lr: { base: 0.05, reference_batch: 32, warmup: { kind: "gradual", epochs: 1 }, decay: { kind: "step", milestones: [2] } },
  },
  "Synthetic data, no dataset download": {
    ...BASE,
    name: "synthetic-mlp",
    dataset: "synthetic:2048",
    train_samples: undefined,
    test_samples: undefined,
  },
};
/** The worker counts the submit view previews the schedule for. */
const PREVIEW_WORKERS = [1, 2, 8, 32];

const $ = (id) => document.getElementById(id);
const current = { page: "signin", job: null, compare: [], me: null, team: null, study: null };
/** The job list's paging: the cursors of the pages before this one, and this page's. */
const paging = { before: [], cursor: null, next: null };
const selected = new Set();
let timer = null;
let checkTimer = null;
/** Checks overlap (each edit starts one): only the newest may write its answer. */
let checkSeq = 0;

/** A call to the API; a refusal becomes an Error with the problem's detail and field errors. */
async function api(path, options = {}) {
  const response = await request(path, options);
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

function request(path, options = {}) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY)}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  return fetch(path, { ...options, headers });
}

function show(page) {
  current.page = page;
  for (const id of ["signin", "jobs", "job", "submit", "studies", "compare", "cluster", "team"]) $(id).hidden = id !== page;
  clearInterval(timer);
  const views = {
    jobs: renderJobs,
    job: renderJob,
    studies: renderStudies,
    compare: renderCompare,
    cluster: renderCluster,
    team: renderTeam,
  };
  const refresh = views[page];
  if (refresh) {
    const guarded = () => refresh().catch((error) => console.warn(`${page}: ${error.message}`));
    guarded();
    // The team view holds forms being typed into: it is drawn once, and again after each change.
    if (page !== "team") timer = setInterval(guarded, 2000);
  }
  if (page === "submit") check();
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

function button(label, onClick, data = {}) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = label;
  Object.assign(element.dataset, data);
  element.addEventListener("click", onClick);
  return element;
}

function percent(fraction, digits = 2) {
  return `${(fraction * 100).toFixed(digits)}%`;
}

function clock(iso) {
  return iso ? iso.slice(0, 19).replace("T", " ") : "";
}

async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    const me = await api("/v1/me");
    current.me = me;
    $("whoami").textContent = `${me.role} of team ${me.team_name}${me.platform ? " (platform admin)" : ""}`;
    $("nav").hidden = false;
    $("team-nav").hidden = me.role !== "admin";
    $("signout").hidden = false;
    $("signin-error").textContent = "";
    show("jobs");
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("signin-error").textContent = `Not signed in: ${error.message}`;
  }
}

// ---- Jobs: the run history, filtered and paged, with live progress and the team's use of its quota ----

function jobsQuery() {
  const query = new URLSearchParams({ limit: $("page-size").value });
  const filters = {
    state: $("state-filter").value,
    name_prefix: $("name-filter").value,
    created_after: $("after-filter").value && `${$("after-filter").value}T00:00:00Z`,
    // the whole day chosen: before the start of the next one
    created_before:
      $("before-filter").value && new Date(Date.parse(`${$("before-filter").value}T00:00:00Z`) + 864e5).toISOString(),
    cursor: paging.cursor,
  };
  for (const [name, value] of Object.entries(filters)) if (value) query.set(name, value);
  return query;
}

function progressText(job) {
  if (job.pending_reason) {
    return `${job.queue_position ? `#${job.queue_position}: ` : ""}${job.pending_reason.message}`;
  }
  const p = job.progress;
  if (p) {
    const of = p.total_iterations ? ` of ${p.total_iterations} (${percent(p.iterations_done / p.total_iterations, 0)})` : "";
    const loss = p.loss !== null && p.loss !== undefined ? `, loss ${p.loss.toFixed(4)}` : "";
    const speed = p.samples_per_s ? `, ${Math.round(p.samples_per_s)} samples/s` : "";
    return `iteration ${p.iterations_done}${of}, epoch ${p.epoch + 1}${loss}${speed}`;
  }
  if (job.result) return `test error ${percent(job.result.final_test_error)}`;
  return job.error || "";
}

async function renderJobs() {
  const [page, pool] = await Promise.all([api(`/v1/jobs?${jobsQuery()}`), api("/v1/nodes")]);
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
    row.appendChild(document.createElement("td")).appendChild(button(job.name || job.id, () => openJob(job.id), { job: job.id }));
    cell(row, job.state).className = "state";
    cell(row, `${job.workers} ${job.device}`);
    cell(row, progressText(job));
    cell(row, clock(job.created_at));
    rows.appendChild(row);
  }
  $("no-jobs").hidden = page.jobs.length > 0;
  paging.next = page.next_cursor;
  $("older-page").disabled = !page.next_cursor;
  $("newer-page").disabled = paging.before.length === 0;
  $("page-number").textContent = `page ${paging.before.length + 1}`;
  renderUsage(pool);
}

/** The devices the team holds now against its guarantee, from the pool's view of who holds what. */
function renderUsage(pool) {
  const me = current.me;
  const held = { gpu: 0, cpu: 0 };
  for (const node of pool.nodes) {
    for (const device of node.devices) {
      if (device.held_by && device.held_by.team_id === me.team_id) held[device.kind] += 1;
    }
  }
  $("team-usage").textContent =
    `Team ${me.team_name} holds ${held.gpu} GPU of its ${me.gpu_quota} guaranteed and ${held.cpu} CPU of its ` +
    `${me.cpu_quota} (idle devices beyond the guarantee may be borrowed).`;
}

function refilter() {
  paging.before = [];
  paging.cursor = null;
  renderJobs();
}

function openJob(id) {
  current.job = id;
  $("log-search").value = "";
  $("log-rank").value = "";
  $("log-follow").checked = true;
  show("job");
}

// ---- Job: recipe, live charts, events, checkpoints, logs; cancel and submit again ----

const metricsOf = (id, kind, name, rank = 0) =>
  api(`/v1/jobs/${id}/metrics?kind=${kind}&rank=${rank}&name=${name}&points=1000&limit=10000`).then((p) => p.points);

async function renderJob() {
  const id = current.job;
  const [job, events, checkpoints] = await Promise.all([
    api(`/v1/jobs/${id}`),
    api(`/v1/jobs/${id}/events`),
    api(`/v1/jobs/${id}/checkpoints`),
  ]);
  renderFacts(job);
  $("cancel").hidden = ["succeeded", "failed", "cancelled"].includes(job.state);
  const eventList = $("job-events");
  eventList.replaceChildren();
  for (const event of events.events) {
    eventList.appendChild(document.createElement("li")).textContent =
      `${clock(event.at)} ${event.to_state}${event.reason ? `: ${event.reason}` : ""}`;
  }
  renderCheckpoints(job, checkpoints.checkpoints);
  if ($("log-follow").checked) await renderLogs(id);
  await renderJobCharts(job);
}

function renderFacts(job) {
  $("job-title").textContent = `Job ${job.name || job.id}`;
  const e = job.effective || {};
  const facts = [
    ["State", job.state],
    ["Devices", `${job.workers} ${job.device}`],
    ["Global batch (kn)", e.global_batch && `${e.global_batch} = ${e.workers} × ${e.per_worker_batch}`],
    ["Learning rate", e.scaled_lr && `${e.scaled_lr} (base ${e.base_lr} for a batch of ${e.reference_batch})`],
    ["Warmup iterations", e.warmup_iterations],
    ["Warmup", e.warmup_skipped],
    ["Decay milestones (epochs)", e.decay_milestones && e.decay_milestones.join(", ")],
    ["Iterations", e.total_iterations && `${e.total_iterations} (${e.iterations_per_epoch} per epoch)`],
    ["Attempt", `${job.attempt} (${job.preemptions} preemptions)`],
  ];
  const p = job.progress;
  if (p) {
    facts.push(["Progress", progressText(job)]);
    if (p.allreduce_share !== null && p.allreduce_share !== undefined) facts.push(["All-reduce share", percent(p.allreduce_share, 1)]);
  }
  if (job.pending_reason) facts.push(["Waiting", job.pending_reason.message]);
  if (job.estimated_start) facts.push(["Starts", job.estimated_start.basis]);
  if (job.result) {
    const r = job.result;
    facts.push(["Final test error", percent(r.final_test_error)]);
    if (r.samples_per_s) facts.push(["Throughput", `${Math.round(r.samples_per_s)} samples/s`]);
    if (r.communication_fraction !== undefined) facts.push(["All-reduce share", percent(r.communication_fraction, 1)]);
  }
  if (job.error) facts.push(["Error", job.error]);
  const list = $("job-facts");
  list.replaceChildren();
  for (const [name, value] of facts) {
    if (value === undefined || value === null || value === "") continue;
    list.appendChild(document.createElement("dt")).textContent = name;
    const dd = list.appendChild(document.createElement("dd"));
    dd.textContent = text(value);
    if (name === "State") dd.id = "job-state";
  }
  current.spec = job.spec;
}

async function renderJobCharts(job) {
  const id = job.id;
  const perIteration = job.effective && job.effective.total_iterations <= 100000;
  const [losses, lrs, speeds, shares, trainErrors, testErrors, planned] = await Promise.all([
    metricsOf(id, "iteration", "loss"),
    metricsOf(id, "iteration", "lr"),
    metricsOf(id, "iteration", "samples_per_s"),
    metricsOf(id, "iteration", "allreduce_share"),
    metricsOf(id, "epoch", "train_error"),
    metricsOf(id, "epoch", "test_error"),
    job.effective ? api(`/v1/jobs/${id}/schedule${perIteration ? "?per_iteration=true" : ""}`) : null,
  ]);
  const series = (points, field, x = "iteration") => points.map((p) => [p[x], p.fields[field]]);
  // epochs are reported 0-based; the chart counts them as people do, from 1
  const byEpoch = (points, field) => points.map((p) => [p.epoch + 1, p.fields[field]]);
  drawChart($("loss-chart"), [{ points: series(losses, "loss") }], { x: "iteration", y: "loss" });
  drawChart(
    $("error-chart"),
    [
      { label: "train", points: byEpoch(trainErrors, "train_error"), colour: COLOURS[1] },
      { label: "test", points: byEpoch(testErrors, "test_error"), colour: COLOURS[0] },
    ],
    { x: "epoch", y: "error", yFromZero: true },
  );
  const lrSeries = [{ label: "used", points: series(lrs, "lr"), colour: COLOURS[0] }];
  if (planned) lrSeries.push({ label: "planned", points: plannedLr(planned), colour: COLOURS[7], dashed: true });
  drawChart($("lr-chart"), lrSeries, { x: "iteration", y: "lr", yFromZero: true });
  drawChart($("speed-chart"), [{ points: series(speeds, "samples_per_s"), colour: COLOURS[2] }], {
    x: "iteration",
    y: "samples/s",
    yFromZero: true,
  });
  drawChart($("allreduce-chart"), [{ points: series(shares, "allreduce_share"), colour: COLOURS[3] }], {
    x: "iteration",
    y: "all-reduce share",
    yFromZero: true,
  });
}

function renderCheckpoints(job, checkpoints) {
  const rows = $("checkpoint-rows");
  rows.replaceChildren();
  for (const checkpoint of checkpoints) {
    const row = document.createElement("tr");
    cell(row, `${checkpoint.name}${checkpoint.is_final ? " (final weights)" : ""}`);
    cell(row, checkpoint.epoch);
    cell(row, checkpoint.iteration);
    cell(row, `${(checkpoint.size_bytes / 2 ** 20).toFixed(2)} MiB`);
    const base = `/v1/jobs/${job.id}/checkpoints/${checkpoint.id}`;
    const downloads = row.appendChild(document.createElement("td"));
    const archive = button("Download", () => download(`${base}/archive`, checkpoint.name), { checkpoint: checkpoint.id });
    archive.setAttribute("aria-label", `download ${checkpoint.name}`);
    downloads.appendChild(archive);
    // the weights alone: a state dict for every model, TorchScript for an uploaded one
    const files = [["model.safetensors", "Weights"]];
    if (job.spec.model.uploaded) files.push(["model.pt", "TorchScript"]);
    for (const [file, label] of files) {
      const weights = button(label, () => download(`${base}/weights/${file}`, `${checkpoint.name}-${file}`), {
        weights: file,
      });
      weights.setAttribute("aria-label", `download ${file} of ${checkpoint.name}`);
      downloads.append(" ", weights);
    }
    rows.appendChild(row);
  }
  $("no-checkpoints").hidden = checkpoints.length > 0;
}

/** A file is fetched with the token (a plain link could not carry it) and saved from memory. */
async function download(path, name) {
  const response = await request(path);
  if (!response.ok) {
    alert(`Download failed: ${response.status}`);
    return;
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
}

async function renderLogs(id) {
  const query = new URLSearchParams({ limit: "500" });
  if ($("log-search").value) query.set("q", $("log-search").value);
  if ($("log-rank").value !== "") query.set("rank", $("log-rank").value);
  const logs = await api(`/v1/jobs/${id}/logs?${query}`);
  const pre = $("job-logs");
  pre.textContent = logs.lines.map((l) => `[rank ${l.rank}] ${l.line}`).join("\n");
  if ($("log-follow").checked) pre.scrollTop = pre.scrollHeight;
}

function submitAgain() {
  const spec = { ...current.spec };
  if (spec.name) spec.name = `${spec.name}-again`;
  $("spec").value = JSON.stringify(spec, null, 2);
  show("submit");
}

// ---- Cluster: nodes, devices and who holds them; the team's queue with the scheduler's reasons ----

function holderText(device) {
  const holder = device.held_by;
  if (!holder) return "free";
  const job = holder.job_id ? ` ${holder.job_name || holder.job_id} rank ${holder.rank}` : "";
  return `${holder.team_name}${job}`;
}

async function renderCluster() {
  const [pool, queued] = await Promise.all([api("/v1/nodes"), api("/v1/jobs?state=queued&limit=500")]);
  const rows = $("node-rows");
  rows.replaceChildren();
  for (const node of pool.nodes) {
    const row = document.createElement("tr");
    cell(row, node.name);
    cell(row, node.state);
    cell(row, `${Math.round((Date.now() - Date.parse(node.last_heartbeat)) / 1000)} s ago`);
    const devices = row.appendChild(document.createElement("td")).appendChild(document.createElement("ul"));
    devices.className = "devices";
    for (const d of node.devices) {
      const memory = d.memory_bytes ? `, ${(d.memory_bytes / 2 ** 30).toFixed(0)} GiB` : "";
      const item = devices.appendChild(document.createElement("li"));
      item.textContent = `${d.kind} ${d.index} (${d.name}${memory}): ${holderText(d)}`;
      item.className = d.held_by ? "busy" : "free";
    }
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

// ---- Studies: the team's studies, and one study's table and plot ----

function statesText(states) {
  return Object.entries(states || {})
    .map(([state, n]) => `${n} ${state}`)
    .join(", ");
}

async function renderStudies() {
  const page = await api("/v1/studies?limit=100");
  const rows = $("study-rows");
  rows.replaceChildren();
  for (const study of page.studies) {
    const row = document.createElement("tr");
    row.appendChild(document.createElement("td")).appendChild(
      button(study.name || study.id, () => openStudy(study.id), { study: study.id }),
    );
    cell(row, study.points);
    cell(row, statesText(study.states));
    cell(row, clock(study.created_at));
    rows.appendChild(row);
  }
  $("no-studies").hidden = page.studies.length > 0;
  if (current.study) await renderStudy();
}

function openStudy(id) {
  current.study = id;
  current.plotDrawn = null;
  renderStudy();
}

async function renderStudy() {
  const study = await api(`/v1/studies/${current.study}`);
  $("study-detail").hidden = false;
  $("study-title").textContent = `${study.name || study.id}: ${statesText(study.states)}`;
  const rows = $("study-point-rows");
  rows.replaceChildren();
  const orDash = (value, format) => (value === null || value === undefined ? "-" : format(value));
  for (const p of study.points) {
    const row = document.createElement("tr");
    row.dataset.point = p.point;
    cell(row, `${p.point}${p.is_reference ? "*" : ""}`);
    cell(row, p.label);
    cell(row, p.global_batch);
    cell(row, `${p.workers} / ${p.devices}`);
    cell(row, p.warmup);
    cell(row, p.scaling);
    cell(row, orDash(p.scaled_lr, (lr) => lr.toPrecision(4)));
    cell(row, orDash(p.train_error[p.train_error.length - 1], percent));
    cell(row, orDash(p.final_test_error ?? p.test_error[p.test_error.length - 1], percent));
    cell(row, orDash(p.vs_reference, (d) => `${d >= 0 ? "+" : ""}${(d * 100).toFixed(2)}`));
    cell(row, orDash(p.wall_seconds, (s) => s.toFixed(0)));
    cell(row, orDash(p.samples_per_s, (s) => s.toFixed(0)));
    const state = cell(row, p.state);
    if (p.error) state.title = p.error;
    rows.appendChild(row);
  }
  // The plot is redrawn only when a point finished another epoch.
  const epochs = study.points.map((p) => p.test_error.length).join(",");
  if (current.plotDrawn !== epochs) {
    const svg = await (await request(study.links.plot)).text();
    const parsed = new DOMParser().parseFromString(svg, "image/svg+xml").documentElement;
    $("study-plot").replaceChildren(document.importNode(parsed, true));
    current.plotDrawn = epochs;
  }
}

// ---- Compare: 2 to 8 jobs' recipes side by side and their curves overlaid, one colour each ----

async function renderCompare() {
  const ids = current.compare;
  const jobs = await Promise.all(ids.map((id) => api(`/v1/jobs/${id}`)));
  const [errors, losses, lrs] = await Promise.all([
    Promise.all(ids.map((id) => metricsOf(id, "epoch", "test_error"))),
    Promise.all(ids.map((id) => metricsOf(id, "iteration", "loss"))),
    Promise.all(ids.map((id) => metricsOf(id, "iteration", "lr"))),
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
    cell(row, job.result ? percent(job.result.final_test_error) : job.state);
    rows.appendChild(row);
  });
  const label = (job) => job.name || job.id.slice(0, 8);
  const lines = (all, toPoint) =>
    all.map((points, i) => ({ label: label(jobs[i]), colour: COLOURS[i], points: points.map((p) => toPoint(p, jobs[i])) }));
  // Iterations mean different amounts of data at different batch sizes: epochs and samples seen compare them.
  const perEpoch = (job) => (job.effective ? job.effective.iterations_per_epoch : 1);
  const batch = (job) => (job.effective ? job.effective.global_batch : 1);
  drawChart($("compare-error-chart"), lines(errors, (p) => [p.epoch + 1, p.fields.test_error]), {
    x: "epoch",
    y: "test error",
    yFromZero: true,
  });
  drawChart($("compare-loss-chart"), lines(losses, (p) => [p.iteration, p.fields.loss]), { x: "iteration", y: "loss" });
  drawChart($("compare-samples-chart"), lines(losses, (p, job) => [(p.iteration + 1) * batch(job), p.fields.loss]), {
    x: "samples seen",
    y: "loss",
  });
  drawChart($("compare-lr-chart"), lines(lrs, (p, job) => [p.iteration / perEpoch(job), p.fields.lr]), {
    x: "epoch",
    y: "lr",
    yFromZero: true,
  });
}

// ---- Submit: the editor, checked on every edit (field errors at their paths, the scheduler's verdict),
// and the schedule previewed for several worker counts ----

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
  const mine = ++checkSeq;
  try {
    const spec = specFromEditor();
    const answer = await api("/v1/jobs?dry_run=true", { method: "POST", body: JSON.stringify(spec) });
    const preview = await previewSchedules(spec);
    if (mine !== checkSeq) return;
    $("spec-errors").replaceChildren();
    $("verdict").textContent = `${answer.verdict}: ${answer.message}`;
    renderPreview(preview);
  } catch (error) {
    if (mine === checkSeq) showErrors(error);
  }
}

/** The spec's schedule for each of PREVIEW_WORKERS, or {error} when it cannot be previewed. */
async function previewSchedules(spec) {
  const workers = PREVIEW_WORKERS.join(",");
  const body = JSON.stringify(spec);
  try {
    return await api(`/v1/schedules/preview?workers=${workers}&per_iteration=true`, { method: "POST", body });
  } catch (error) {
    // too many iterations to list: the change points draw the same shape
    return api(`/v1/schedules/preview?workers=${workers}`, { method: "POST", body }).catch((error) => ({ error }));
  }
}

function renderPreview(answer) {
  const charts = $("preview-charts");
  charts.replaceChildren();
  if (answer.error) {
    const reasons = answer.error.fields.map((f) => `${f.path}: ${f.reason}`).join("; ");
    charts.appendChild(document.createElement("p")).textContent = `No preview: ${reasons || answer.error.message}`;
    return;
  }
  for (const { workers: k, schedule } of answer.schedules) {
    const e = schedule.effective;
    const figure = charts.appendChild(document.createElement("figure"));
    figure.dataset.workers = k;
    const caption = figure.appendChild(document.createElement("figcaption"));
    caption.textContent =
      `k = ${k}: batch ${e.global_batch}, lr ${Number(e.scaled_lr.toPrecision(4))}, ` +
      `warmup ${e.warmup_iterations} of ${e.total_iterations} iterations`;
    if (e.warmup_skipped) figure.appendChild(document.createElement("p")).textContent = e.warmup_skipped;
    const canvas = figure.appendChild(document.createElement("canvas"));
    Object.assign(canvas, { width: 260, height: 170 });
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", `learning rate per epoch with ${k} workers`);
    const perEpoch = e.iterations_per_epoch || 1;
    const points = plannedLr(schedule).map(([i, lr]) => [i / perEpoch, lr]);
    drawChart(canvas, [{ points, colour: COLOURS[PREVIEW_WORKERS.indexOf(k) % COLOURS.length] }], {
      x: "epoch",
      y: "lr",
      yFromZero: true,
    });
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

// ---- Team (admins): teams and quotas (a platform admin creates teams and sets quotas), tokens ----

async function renderTeam() {
  const me = current.me;
  const { teams } = await api("/v1/teams");
  current.team = current.team && teams.some((t) => t.id === current.team) ? current.team : me.team_id;
  const rows = $("team-rows");
  rows.replaceChildren();
  for (const team of teams) {
    const row = document.createElement("tr");
    row.dataset.team = team.name;
    cell(row, team.name);
    for (const kind of ["gpu_quota", "cpu_quota"]) {
      if (me.platform) {
        const input = document.createElement("input");
        Object.assign(input, { type: "number", min: 0, value: team[kind] });
        input.dataset.field = kind;
        input.setAttribute("aria-label", `${team.name} ${kind.replace("_", " ")}`);
        row.appendChild(document.createElement("td")).appendChild(input);
      } else {
        cell(row, team[kind]);
      }
    }
    cell(row, team.weight);
    cell(row, team.budget ? `${team.budget.device_hours} device-hours per ${team.budget.period}` : "none");
    const actions = row.appendChild(document.createElement("td"));
    actions.appendChild(button("Tokens", () => ((current.team = team.id), renderTeam()), { team: team.id }));
    if (me.platform) actions.appendChild(button("Save quotas", () => saveQuotas(team.id, row)));
    rows.appendChild(row);
  }
  $("team-create").hidden = !me.platform;
  const team = teams.find((t) => t.id === current.team);
  $("tokens-title").textContent = `Tokens of team ${team ? team.name : ""}`;
  const { tokens } = await api(`/v1/teams/${current.team}/tokens`);
  const tokenRows = $("token-rows");
  tokenRows.replaceChildren();
  for (const token of tokens) {
    const row = document.createElement("tr");
    row.dataset.token = token.id;
    cell(row, token.label || token.id.slice(0, 8));
    cell(row, `${token.role}${token.platform ? " (platform)" : ""}`);
    cell(row, clock(token.created_at));
    cell(row, clock(token.last_used_at) || "never");
    cell(row, clock(token.expires_at) || "never");
    const state = row.appendChild(document.createElement("td"));
    if (token.revoked_at) state.textContent = `revoked ${clock(token.revoked_at)}`;
    else if (token.id === me.token_id) state.textContent = "this session";
    else {
      const revoke = button("Revoke", () => revokeToken(token, revoke), { revoke: token.id });
      revoke.setAttribute("aria-label", `revoke ${token.label || token.id}`);
      state.appendChild(revoke);
    }
    tokenRows.appendChild(row);
  }
}

async function teamAction(action) {
  try {
    $("team-error").textContent = "";
    await action();
  } catch (error) {
    const fields = (error.fields || []).map((f) => `${f.path}: ${f.reason}`).join("; ");
    $("team-error").textContent = `${error.message}${fields ? ` (${fields})` : ""}`;
  }
  await renderTeam();
}

function saveQuotas(id, row) {
  const value = (field) => Number(row.querySelector(`input[data-field=${field}]`).value);
  return teamAction(() =>
    api(`/v1/teams/${id}`, {
      method: "PATCH",
      body: JSON.stringify({ gpu_quota: value("gpu_quota"), cpu_quota: value("cpu_quota") }),
    }),
  );
}

/** Revoking takes a second click on the same button (whoever uses the token is refused from then on). */
function revokeToken(token, revoke) {
  if (revoke.dataset.armed !== "yes") {
    revoke.dataset.armed = "yes";
    revoke.textContent = "Click again to revoke";
    return;
  }
  return teamAction(() => api(`/v1/tokens/${token.id}`, { method: "DELETE" }));
}

// ---- wiring ----

document.addEventListener("DOMContentLoaded", () => {
  const examples = $("example");
  for (const name of Object.keys(EXAMPLES)) examples.appendChild(new Option(name, name));
  examples.addEventListener("change", () => {
    $("spec").value = JSON.stringify(EXAMPLES[examples.value], null, 2);
    check();
  });
  $("spec").value = JSON.stringify(Object.values(EXAMPLES)[0], null, 2);
  $("spec").addEventListener("input", () => {
    clearTimeout(checkTimer);
    checkTimer = setTimeout(check, 400);
  });
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim());
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  for (const navButton of document.querySelectorAll("#nav button")) {
    navButton.addEventListener("click", () => show(navButton.dataset.page));
  }
  $("job-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    refilter();
  });
  $("state-filter").addEventListener("change", refilter);
  $("page-size").addEventListener("change", refilter);
  $("older-page").addEventListener("click", () => {
    paging.before.push(paging.cursor);
    paging.cursor = paging.next;
    renderJobs();
  });
  $("newer-page").addEventListener("click", () => {
    paging.cursor = paging.before.pop() ?? null;
    renderJobs();
  });
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
  $("submit-again").addEventListener("click", submitAgain);
  $("cancel-study").addEventListener("click", async () => {
    await api(`/v1/studies/${current.study}/cancel`, { method: "POST" });
    renderStudies();
  });
  $("log-filters").addEventListener("submit", (event) => event.preventDefault());
  for (const id of ["log-search", "log-rank", "log-follow"]) {
    $(id).addEventListener("input", () => renderLogs(current.job));
  }
  $("check").addEventListener("click", check);
  $("send").addEventListener("click", send);
  $("team-create").addEventListener("submit", (event) => {
    event.preventDefault();
    teamAction(() =>
      api("/v1/teams", {
        method: "POST",
        body: JSON.stringify({
          name: $("new-team-name").value,
          gpu_quota: Number($("new-team-gpu").value),
          cpu_quota: Number($("new-team-cpu").value),
        }),
      }),
    );
  });
  $("token-create").addEventListener("submit", (event) => {
    event.preventDefault();
    teamAction(async () => {
      const label = $("new-token-label").value.trim();
      const created = await api(`/v1/teams/${current.team}/tokens`, {
        method: "POST",
        body: JSON.stringify({ role: $("new-token-role").value, ...(label ? { label } : {}) }),
      });
      $("new-token").textContent = `New ${created.info.role} token (shown this once, copy it now): ${created.token}`;
    });
  });
  if (sessionStorage.getItem(TOKEN_KEY)) signIn(sessionStorage.getItem(TOKEN_KEY));
});
