// Job: what the run is (its configuration, asked and effective), its times and what it used, its tags and
// note, live charts, events, checkpoints (downloaded with the token, or forked into a new job) and logs;
// cancelled, resumed, or submitted again through the editor.

import { api, metricsOf, refusal, request } from "../api.js";
import { COLOURS, drawChart, plannedLr } from "../charts.js";
import { $, act, add, button, cell, clock, duration, linkedText, percent, text } from "../dom.js";
import { bestTestError, progressText } from "./jobs.js";

/** A run's timeline in words: "training steps 44.9 s, evaluation 3.0 s, ...; start-up 0.6 s". */
function timelineText(t) {
  const s = (x) => `${(x ?? 0).toFixed(1)} s`;
  return (
    `training steps ${s(t.train_steps_s)}, evaluation ${s(t.evaluation_s)}, checkpoints ${s(t.checkpoint_s)}, ` +
    `metrics lines ${s(t.reporting_s)}, other ${s(t.other_s)}; start-up ${s(t.start_up_s)} (rank 0, its last placement)`
  );
}

/** A pipelined run's stages in words: "stage 0 busy 64%, waiting 33%, sending 3%, 1.2 MB a step; …;
 * the schedule's bubble 33%". */
function stagesText(t) {
  const pct = (x) => `${Math.round((x ?? 0) * 100)}%`;
  const stages = t.stages.map(
    (s) =>
      `stage ${s.stage} busy ${pct(s.busy_share)}, waiting ${pct(s.waiting_share)}, sending ${pct(s.sending_share)}, ` +
      `${((s.bytes_sent_per_step ?? 0) / 1e6).toFixed(1)} MB a step`,
  );
  return `${stages.join("; ")}; the schedule's bubble ${pct(t.bubble_share)} (the first worker's stages)`;
}

/** The job shown. */
let jobId = null;
/** Its spec as last fetched, for "Submit again". */
let spec = null;
/** The shell: navigate(page, arg) and me(). */
let app = null;

export const live = true;

const ENDED = ["succeeded", "failed", "cancelled", "stopped"];

/** Shows job `id`: its log filters reset, no error left from the job shown before. */
export function open(id) {
  if (id === undefined) return;
  jobId = id;
  spec = null;
  $("log-search").value = "";
  $("log-rank").value = "";
  $("log-follow").checked = true;
  $("job-error").textContent = "";
  $("note-state").textContent = "";
  $("job-note").dataset.saved = "";
  $("job-note").value = "";
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
  renderConfiguration(job);
  renderAnnotations(job);
  spec = job.spec;
  $("job-spec").textContent = JSON.stringify(job.spec, null, 2);
  $("cancel").hidden = ENDED.includes(job.state);
  $("resume").hidden = !["failed", "cancelled", "stopped"].includes(job.state);
  const eventList = $("job-events");
  eventList.replaceChildren();
  for (const event of events.events) {
    const item = add(eventList, "li");
    // a state change names the state it reached; any other event (a warning) its kind
    const what = event.kind === "state" ? event.to_state : event.kind;
    linkedText(item, `${clock(event.at)} ${what}${event.reason ? `: ${event.reason}` : ""}`);
  }
  renderCheckpoints(job, checkpoints.checkpoints);
  renderPlacements(job.placements || []);
  if ($("log-follow").checked) await renderLogs();
  await Promise.all([renderCharts(job), renderSystemCharts(job)]);
}

function renderFacts(job) {
  $("job-title").textContent = `Job ${job.name || job.id}`;
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
    ["Starts from", s.init_from ? `the weights of checkpoint ${s.init_from.checkpoint}` : ""],
    [
      "Optimizer",
      `SGD, momentum ${optimizer.momentum ?? 0.9}${nesterov ? " (Nesterov)" : ""}, weight decay ${optimizer.weight_decay ?? 0.0001}`,
    ],
    ["Seed", s.seed ?? 0],
    ["Precision", s.precision || "fp32"],
    ...times(job),
    ["Attempt", `${job.attempt} (${job.preemptions} preemptions)`],
  ];
  const p = job.progress;
  if (p) {
    facts.push(["Progress", progressText(job)]);
    if (p.seconds_left !== null && p.seconds_left !== undefined) {
      facts.push(["Time left", `about ${duration(Math.round(p.seconds_left))} at the current rate`]);
    }
    if (p.allreduce_share !== null && p.allreduce_share !== undefined) facts.push(["All-reduce share", percent(p.allreduce_share, 1)]);
  }
  if (job.pending_reason) facts.push(["Waiting", job.pending_reason.message]);
  if (job.estimated_start) facts.push(["Starts", job.estimated_start.basis]);
  if (job.result) {
    const r = job.result;
    facts.push(["Final test error", percent(r.final_test_error)]);
    const best = bestTestError(job);
    if (best !== null) facts.push(["Best test error", percent(best)]);
    if (r.samples_per_s) facts.push(["Throughput", `${Math.round(r.samples_per_s)} samples/s`]);
    if (r.communication_fraction !== undefined) facts.push(["All-reduce share", percent(r.communication_fraction, 1)]);
    if (r.timeline) facts.push(["Where the time went", timelineText(r.timeline)]);
    if (r.timeline?.stages?.length) facts.push(["Pipeline stages", stagesText(r.timeline)]);
  }
  const used = job.resources;
  if (used) {
    facts.push(["Device time", `${duration(Math.round(used.device_seconds))} (${used.device_seconds.toFixed(1)} device-seconds)`]);
    if (used.peak_rss_bytes) facts.push(["Peak memory of a rank", `${(used.peak_rss_bytes / 2 ** 20).toFixed(0)} MiB`]);
    if (used.cpu_cores) {
      const when = job.state === "running" ? "now" : "at its last report";
      facts.push(["CPU use", `${used.cpu_cores.toFixed(1)} cores busy ${when} (all ranks)`]);
    }
  }
  if (job.error) facts.push(["Error", job.error]);
  const list = $("job-facts");
  list.replaceChildren();
  for (const [name, value] of facts) {
    if (text(value) === "") continue;
    add(list, "dt", name);
    const dd = add(list, "dd");
    if (name === "Waiting") linkedText(dd, value);
    else dd.textContent = text(value);
    if (name === "State") {
      dd.id = "job-state";
      dd.className = `state ${value}`;
    }
  }
}

/** The spec's recipe as asked, beside what the run does with it (the effective hyperparameters). */
function renderConfiguration(job) {
  const s = job.spec || {};
  const e = job.effective;
  const lr = s.lr || {};
  const warmup = lr.warmup || {};
  const decay = lr.decay || {};
  const rows = [
    ["Workers × batch per worker", `${s.workers ?? 1} × ${s.per_worker_batch ?? 32}`,
      e && `${e.workers} × ${e.per_worker_batch} = global batch ${e.global_batch}`],
    ["Devices", s.devices ?? "as many as workers", `${job.devices} ${job.device}`],
    ["Learning rate", `${lr.base ?? 0.1} for a batch of ${lr.reference_batch ?? 256}, ${lr.scaling || "linear"} scaling${lr.max ? `, at most ${lr.max}` : ""}`,
      e && `${e.scaled_lr} (× ${Number(e.scaling_factor.toPrecision(6))})`],
    ["Warmup", (warmup.kind || "gradual") === "none" ? "none" : `${warmup.kind || "gradual"}, ${epochs(warmup.epochs ?? 5)}`,
      e && (e.warmup_skipped ? `none: ${e.warmup_skipped}` : `${e.warmup_iterations} iterations (${epochs(e.warmup_epochs)})`)],
    ["Decay", decayAsked(decay),
      e && (e.decay_kind === "step" ? `step at epochs ${e.decay_milestones.join(", ")}, × ${e.decay_factor}` : e.decay_kind)],
    ["Epochs", s.epochs ?? 90, e && `${e.epochs}: ${e.total_iterations} iterations (${e.iterations_per_epoch} per epoch)`],
    ["Training samples", s.train_samples ?? "all", e && `${e.train_size} of ${job.dataset_size}`],
  ];
  const body = $("config-rows");
  body.replaceChildren();
  for (const [name, asked, effective] of rows) {
    const row = body.appendChild(document.createElement("tr"));
    add(row, "th", name).scope = "row";
    cell(row, asked);
    cell(row, effective ?? "known once the dataset's size is (idx: data: when a rank reads it)");
  }
}

/** `1 epoch`, `2.5 epochs`. */
const epochs = (n) => `${n} epoch${n === 1 ? "" : "s"}`;

/** The spec's decay as written, its defaults said as the defaults they are. */
function decayAsked(decay) {
  const kind = decay.kind || "step";
  if (kind !== "step") return kind;
  const at = decay.milestones ? `at epochs ${decay.milestones.join(", ")}` : "at 1/3, 2/3 and 8/9 of the epochs (the default)";
  return `step ${at}, × ${decay.factor ?? 0.1}`;
}

/** The job's tags (each with a button taking it off) and its note, editable in place. */
function renderAnnotations(job) {
  const list = $("job-tags");
  list.replaceChildren();
  for (const tag of job.tags) {
    const item = add(list, "li", tag);
    const remove = button("×", () => saveAnnotations({ tags: job.tags.filter((t) => t !== tag) }), { tag });
    remove.setAttribute("aria-label", `remove tag ${tag}`);
    item.append(" ", remove);
  }
  $("no-tags").hidden = job.tags.length > 0;
  const note = $("job-note");
  // a note being written is not overwritten by the next refresh
  if (document.activeElement !== note && note.dataset.saved !== job.note) {
    note.value = job.note;
    note.dataset.saved = job.note;
  }
}

/** Sets the job's tags and/or note; the view shows the answer. */
function saveAnnotations(change) {
  return act($("job-error"), async () => {
    const job = await api(`/v1/jobs/${jobId}`, { method: "PATCH", body: JSON.stringify(change) });
    renderAnnotations(job);
    $("note-state").textContent = change.note !== undefined ? "Saved." : "";
  });
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
  const empty = (what) => emptyText(job, what);
  drawChart($("loss-chart"), [{ label: "training loss, mean over the ranks", points: series(losses, "loss") }], {
    x: "iteration",
    y: "loss",
    logToggle: true,
    empty: empty("iteration"),
  });
  drawChart(
    $("error-chart"),
    [
      { label: "train", points: byEpoch(trainErrors, "train_error"), colour: COLOURS[1] },
      { label: "test", points: byEpoch(testErrors, "test_error"), colour: COLOURS[0] },
    ],
    { x: "epoch", y: "error (%)", yFormat: "percent", xInteger: true, yFromZero: true, empty: empty("epoch") },
  );
  const lrSeries = [{ label: "used", points: series(lrs, "lr"), colour: COLOURS[0] }];
  if (planned) lrSeries.push({ label: "planned", points: plannedLr(planned), colour: COLOURS[7], dashed: true });
  drawChart($("lr-chart"), lrSeries, { x: "iteration", y: "learning rate", yFromZero: true, logToggle: true, empty: empty("iteration") });
  drawChart($("speed-chart"), [{ points: series(speeds, "samples_per_s"), colour: COLOURS[2] }], {
    x: "iteration",
    y: "samples/s",
    yFromZero: true,
    empty: empty("iteration"),
  });
  drawChart($("allreduce-chart"), [{ points: series(shares, "allreduce_share"), colour: COLOURS[3] }], {
    x: "iteration",
    y: "all-reduce share (%)",
    yFormat: "percent",
    yFromZero: true,
    height: 180,
    empty: job.devices === 1 && job.workers === 1 ? "one rank: nothing to reduce" : empty("iteration"),
  });
}

/** Ranks charted one line each on the system charts; a larger job shows its first ones. */
const SYSTEM_RANKS = 8;

/**
 * Each rank's CPU cores and resident memory over the job's time (minutes since its first sample): the
 * agents' `system` reports, whose iteration is the Unix second of the sample (each also says the training
 * iteration its rank had reached, `iteration_reached`).
 */
async function renderSystemCharts(job) {
  const id = job.id;
  const ranks = Math.min(job.devices || 1, SYSTEM_RANKS);
  const perRank = await Promise.all(
    Array.from({ length: ranks }, (_, rank) =>
      api(`/v1/jobs/${id}/metrics?kind=system&rank=${rank}&points=500&limit=10000`).then((page) => page.points),
    ),
  );
  if (id !== jobId) return;
  const first = Math.min(...perRank.flat().map((p) => p.iteration));
  const minutes = (p) => (p.iteration - first) / 60;
  const series = (field) =>
    perRank.map((points, rank) => ({ label: `rank ${rank}`, points: points.map((p) => [minutes(p), p.fields[field]]) }));
  const empty = emptyText(job, "sample");
  const shown = job.devices > SYSTEM_RANKS ? ` (first ${SYSTEM_RANKS} of ${job.devices} ranks)` : "";
  drawChart($("cpu-chart"), series("cpu_cores"), {
    x: `minutes since the first sample${shown}`,
    y: "CPU cores busy",
    yFromZero: true,
    height: 180,
    empty,
  });
  drawChart($("memory-chart"), series("resident_bytes"), {
    x: `minutes since the first sample${shown}`,
    y: "resident memory",
    yFormat: "bytes",
    yFromZero: true,
    height: 180,
    empty,
  });
}

/** What a chart says while it has nothing to draw, by the job's state. */
function emptyText(job, what) {
  if (job.state === "queued") return "not started yet";
  if (["scheduled", "running"].includes(job.state)) return `no ${what} reported yet`;
  return `no ${what} was reported before the job ${job.state === "succeeded" ? "ended" : `was ${job.state}`}`;
}

function renderPlacements(placements) {
  const rows = $("placement-rows");
  rows.replaceChildren();
  for (const p of placements) {
    const row = rows.appendChild(document.createElement("tr"));
    row.dataset.placement = p.placement;
    const dash = (value, show = (v) => v) => (value === null || value === undefined ? "-" : show(value));
    for (const value of [
      p.placement,
      p.devices,
      clock(p.started_at),
      duration(Math.round(p.wall_seconds)),
      p.device_seconds.toFixed(1),
      dash(p.resumed_from_iteration),
      dash(p.iterations),
      dash(p.restart_seconds, (s) => duration(Math.round(s))),
      p.ended,
    ]) {
      cell(row, value);
    }
  }
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
    // a new job from these weights: the editor opens with this job's spec, to change before submitting
    const fork = button("Fork", () => forkFrom(job, checkpoint), { fork: checkpoint.id });
    fork.setAttribute("aria-label", `a new job from the weights of ${checkpoint.name}`);
    add(row, "td").appendChild(fork);
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

/** Numbers each read of the logs: typing fires one per keystroke, and their answers may come back out of
 * order, so only the newest read may draw (an older one would show a search the box no longer holds). */
let logsAsked = 0;

async function renderLogs() {
  const id = jobId;
  const asked = ++logsAsked;
  const query = new URLSearchParams({ limit: "500" });
  if ($("log-search").value) query.set("q", $("log-search").value);
  if ($("log-rank").value !== "") query.set("rank", $("log-rank").value);
  const logs = await api(`/v1/jobs/${id}/logs?${query}`);
  if (id !== jobId || asked !== logsAsked) return;
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

/** Queues the ended job again; it resumes from its newest checkpoint. */
function resume() {
  return act($("job-error"), async () => {
    await api(`/v1/jobs/${jobId}/resume`, { method: "POST" });
    await refresh();
  });
}

/** The editor with this job's spec, renamed "<name>-fork", starting from `checkpoint`'s weights. */
function forkFrom(job, checkpoint) {
  const fork = { ...job.spec, init_from: { checkpoint: checkpoint.id } };
  fork.name = `${job.spec.name || "job"}-fork`;
  app.navigate("submit", fork);
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
  $("resume").addEventListener("click", resume);
  $("tag-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const tag = $("new-tag").value.trim();
    if (!tag) return;
    const tags = [...$("job-tags").querySelectorAll("button[data-tag]")].map((b) => b.dataset.tag);
    saveAnnotations({ tags: [...tags, tag] }).then((saved) => {
      if (saved) $("new-tag").value = "";
    });
  });
  $("save-note").addEventListener("click", () => saveAnnotations({ note: $("job-note").value }));
  $("submit-again").addEventListener("click", submitAgain);
  $("log-filters").addEventListener("submit", (event) => event.preventDefault());
  for (const id of ["log-search", "log-rank", "log-follow"]) {
    $(id).addEventListener("input", () => act($("job-error"), renderLogs));
  }
}
