// Job: its recipe, live charts, events, checkpoints (downloaded with the token) and logs; cancelled, or
// submitted again through the editor.

import { api, metricsOf, refusal, request } from "../api.js";
import { COLOURS, drawChart, plannedLr } from "../charts.js";
import { $, act, add, button, cell, clock, percent, text } from "../dom.js";
import { progressText } from "./jobs.js";

/** The job shown. */
let jobId = null;
/** Its spec as last fetched, for "Submit again". */
let spec = null;
/** The shell: navigate(page, arg) and me(). */
let app = null;

export const live = true;

const ENDED = ["succeeded", "failed", "cancelled"];

/** Shows job `id`: its log filters reset, no error left from the job shown before. */
export function open(id) {
  if (id === undefined) return;
  jobId = id;
  spec = null;
  $("log-search").value = "";
  $("log-rank").value = "";
  $("log-follow").checked = true;
  $("job-error").textContent = "";
}

export async function refresh() {
  const id = jobId;
  const [job, events, checkpoints] = await Promise.all([
    api(`/v1/jobs/${id}`),
    api(`/v1/jobs/${id}/events`),
    api(`/v1/jobs/${id}/checkpoints`),
  ]);
  if (id !== jobId) return;
  renderFacts(job);
  spec = job.spec;
  $("job-spec").textContent = JSON.stringify(job.spec, null, 2);
  $("cancel").hidden = ENDED.includes(job.state);
  const eventList = $("job-events");
  eventList.replaceChildren();
  for (const event of events.events) {
    add(eventList, "li", `${clock(event.at)} ${event.to_state}${event.reason ? `: ${event.reason}` : ""}`);
  }
  renderCheckpoints(job, checkpoints.checkpoints);
  if ($("log-follow").checked) await renderLogs();
  await renderCharts(job);
}

function renderFacts(job) {
  $("job-title").textContent = `Job ${job.name || job.id}`;
  const e = job.effective || {};
  const s = job.spec || {};
  const model = s.model ? s.model.name || `uploaded model ${s.model.uploaded}` : "";
  const optimizer = s.optimizer || {};
  const nesterov = optimizer.nesterov ?? true;
  const facts = [
    ["State", job.state],
    [
      "Devices",
      job.devices === job.workers
        ? `${job.devices} ${job.device}`
        : `${job.devices} ${job.device} (${job.workers} workers as virtual ranks)`,
    ],
    ["Model", model],
    ["Dataset", s.dataset],
    ["Epochs", e.epochs ?? s.epochs],
    [
      "Optimizer",
      `SGD, momentum ${optimizer.momentum ?? 0.9}${nesterov ? " (Nesterov)" : ""}, weight decay ${optimizer.weight_decay ?? 0.0001}`,
    ],
    ["Seed", s.seed ?? 0],
    ["Precision", s.precision || "fp32"],
    ...times(job),
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
    if (text(value) === "") continue;
    add(list, "dt", name);
    const dd = add(list, "dd", value);
    if (name === "State") dd.id = "job-state";
  }
}

/** When it was submitted, started and ended, and how long it ran (or has been running). */
function times(job) {
  const rows = [["Submitted", clock(job.created_at)]];
  if (job.started_at) rows.push(["Started", clock(job.started_at)]);
  if (job.finished_at) rows.push(["Ended", clock(job.finished_at)]);
  if (job.started_at) {
    const end = job.finished_at ? new Date(job.finished_at) : new Date();
    const seconds = Math.max(0, Math.round((end - new Date(job.started_at)) / 1000));
    rows.push([job.finished_at ? "Duration" : "Running for", duration(seconds)]);
  }
  return rows;
}

/** `45 s`, `2 min 31 s`, `3 h 05 min`. */
export function duration(seconds) {
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${String(seconds % 60).padStart(2, "0")} s`;
  return `${Math.floor(seconds / 3600)} h ${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")} min`;
}

async function renderCharts(job) {
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
  if (id !== jobId) return;
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
    const downloads = add(row, "td");
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
function download(path, name) {
  return act($("job-error"), async () => {
    const response = await request(path);
    if (!response.ok) throw await refusal(response);
    const link = document.createElement("a");
    link.href = URL.createObjectURL(await response.blob());
    link.download = name;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
  });
}

async function renderLogs() {
  const id = jobId;
  const query = new URLSearchParams({ limit: "500" });
  if ($("log-search").value) query.set("q", $("log-search").value);
  if ($("log-rank").value !== "") query.set("rank", $("log-rank").value);
  const logs = await api(`/v1/jobs/${id}/logs?${query}`);
  if (id !== jobId) return;
  const pre = $("job-logs");
  pre.textContent = logs.lines.map((l) => `[rank ${l.rank}] ${l.line}`).join("\n");
  if ($("log-follow").checked) pre.scrollTop = pre.scrollHeight;
}

function cancel() {
  const name = $("job-title").textContent.replace(/^Job /, "");
  if (!window.confirm(`Cancel ${name}? Its ranks are stopped now; its checkpoints are kept.`)) return undefined;
  return act($("job-error"), async () => {
    await api(`/v1/jobs/${jobId}/cancel`, { method: "POST" });
    await refresh();
  });
}

/** The editor with this job's spec, renamed "<name>-again". */
function submitAgain() {
  if (!spec) {
    $("job-error").textContent = "The job's spec has not loaded yet.";
    return;
  }
  const again = { ...spec };
  if (again.name) again.name = `${again.name}-again`;
  app.navigate("submit", again);
}

export function wire(shell) {
  app = shell;
  $("cancel").addEventListener("click", cancel);
  $("submit-again").addEventListener("click", submitAgain);
  $("log-filters").addEventListener("submit", (event) => event.preventDefault());
  for (const id of ["log-search", "log-rank", "log-follow"]) {
    $(id).addEventListener("input", () => act($("job-error"), renderLogs));
  }
}
