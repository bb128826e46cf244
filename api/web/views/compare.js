// Compare: 2 to 8 jobs side by side: every field of their specs (the ones that differ first), a scatter of
// final test error against a parameter of choice, and their curves overlaid, one colour each.

import { api, metricsOf } from "../api.js";
import { COLOURS, drawChart } from "../charts.js";
import { $, add, cell, jobLink, percent } from "../dom.js";

/** The jobs compared, in the order they were picked, and the jobs as last fetched. */
let ids = [];
let jobs = [];

export const live = true;

/** Compares the jobs `picked` (the Jobs view checks there are 2 to 8). */
export function open(picked) {
  if (picked !== undefined) ids = picked;
}

const label = (job) => job.name || job.id.slice(0, 8);

/** Every leaf of a spec as `path → value` (arrays as values: milestones are one setting). */
export function flatten(value, prefix = "", into = new Map()) {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    for (const [key, inner] of Object.entries(value)) flatten(inner, prefix ? `${prefix}.${key}` : key, into);
  } else {
    into.set(prefix, value);
  }
  return into;
}

/** The parameters the scatter can put on its x axis: the effective values, then every numeric spec field. */
function parameters(specs) {
  const effective = [
    ["effective.scaled_lr", "lr (scaled)"],
    ["effective.global_batch", "kn (global batch)"],
    ["effective.workers", "k (workers)"],
    ["effective.per_worker_batch", "n (batch per worker)"],
    ["effective.warmup_iterations", "warmup iterations"],
    ["effective.epochs", "epochs"],
  ];
  const numeric = [...new Set(specs.flatMap((s) => [...s.entries()].filter(([, v]) => typeof v === "number").map(([p]) => p)))]
    .sort()
    .map((path) => [`spec.${path}`, path]);
  return [...effective, ...numeric];
}

function parameterValue(job, spec, key) {
  if (key.startsWith("effective.")) return job.effective ? job.effective[key.slice(10)] : undefined;
  return spec.get(key.slice(5));
}

export async function refresh() {
  const picked = ids;
  const fetched = await Promise.all(picked.map((id) => api(`/v1/jobs/${id}`)));
  const [errors, losses, lrs] = await Promise.all([
    Promise.all(picked.map((id) => metricsOf(id, "epoch", "test_error"))),
    Promise.all(picked.map((id) => metricsOf(id, "iteration", "loss"))),
    Promise.all(picked.map((id) => metricsOf(id, "iteration", "lr"))),
  ]);
  if (picked !== ids) return;
  jobs = fetched;
  renderSummary();
  renderDiff();
  renderScatter();
  const lines = (all, toPoint) =>
    all.map((points, i) => ({ label: label(jobs[i]), colour: COLOURS[i], points: points.map((p) => toPoint(p, jobs[i])) }));
  // Iterations mean different amounts of data at different batch sizes: epochs and samples seen compare them.
  const perEpoch = (job) => (job.effective ? job.effective.iterations_per_epoch : 1);
  const batch = (job) => (job.effective ? job.effective.global_batch : 1);
  drawChart($("compare-error-chart"), lines(errors, (p) => [p.epoch + 1, p.fields.test_error]), {
    x: "epoch",
    y: "test error (%)",
    yFormat: "percent",
    xInteger: true,
    yFromZero: true,
  });
  drawChart($("compare-loss-chart"), lines(losses, (p) => [p.iteration, p.fields.loss]), {
    x: "iteration",
    y: "loss",
    logToggle: true,
  });
  drawChart($("compare-samples-chart"), lines(losses, (p, job) => [(p.iteration + 1) * batch(job), p.fields.loss]), {
    x: "samples seen",
    y: "loss",
    logToggle: true,
  });
  drawChart($("compare-lr-chart"), lines(lrs, (p, job) => [p.iteration / perEpoch(job), p.fields.lr]), {
    x: "epoch",
    y: "learning rate",
    yFromZero: true,
    logToggle: true,
  });
}

/** One row a job: its recipe and outcome. */
function renderSummary() {
  const rows = $("compare-rows");
  rows.replaceChildren();
  jobs.forEach((job, i) => {
    const e = job.effective || {};
    const row = document.createElement("tr");
    const name = add(row, "td");
    name.appendChild(jobLink(job.id, label(job))).style.color = COLOURS[i];
    for (const value of [e.workers, e.per_worker_batch, e.global_batch, e.scaled_lr, e.warmup_iterations, e.epochs]) {
      cell(row, value);
    }
    cell(row, job.result ? percent(job.result.final_test_error) : job.state);
    rows.appendChild(row);
  });
}

/** Every spec field of the jobs, one row each: those that differ first (marked), then the rest if asked. */
function renderDiff() {
  const specs = jobs.map((job) => flatten(job.spec));
  const paths = [...new Set(specs.flatMap((s) => [...s.keys()]))].sort();
  const show = (v) => (v === undefined ? "(default)" : JSON.stringify(v));
  const differing = paths.filter((p) => new Set(specs.map((s) => show(s.get(p)))).size > 1);
  const same = paths.filter((p) => !differing.includes(p));
  const head = $("diff-head");
  head.replaceChildren();
  add(head, "th", "Spec field");
  jobs.forEach((job, i) => (add(head, "th", label(job)).style.color = COLOURS[i]));
  const body = $("diff-rows");
  body.replaceChildren();
  const all = $("diff-all").checked;
  for (const path of all ? [...differing, ...same] : differing) {
    const row = body.appendChild(document.createElement("tr"));
    row.dataset.path = path;
    if (differing.includes(path)) row.className = "differs";
    add(row, "th", path).scope = "row";
    for (const spec of specs) cell(row, show(spec.get(path)));
  }
  $("diff-summary").textContent =
    `${differing.length} of ${paths.length} fields differ` + (differing.length === 0 ? ": the specs are the same" : "");
  // the scatter's choice of parameter follows the fields there are
  const select = $("scatter-parameter");
  const chosen = select.value;
  select.replaceChildren();
  for (const [key, name] of parameters(specs)) {
    const option = add(select, "option", name);
    option.value = key;
  }
  select.value = [...select.options].some((o) => o.value === chosen) ? chosen : "effective.scaled_lr";
}

/** Final test error against the chosen parameter, one dot a finished job. */
function renderScatter() {
  const key = $("scatter-parameter").value;
  const name = $("scatter-parameter").selectedOptions[0]?.textContent || key;
  const specs = jobs.map((job) => flatten(job.spec));
  const series = jobs.map((job, i) => ({
    label: label(job),
    colour: COLOURS[i],
    dots: true,
    points: job.result ? [[parameterValue(job, specs[i], key), job.result.final_test_error]] : [],
  }));
  drawChart($("compare-scatter"), series, {
    x: name,
    y: "final test error (%)",
    yFormat: "percent",
    empty: "no job has finished: nothing to place",
  });
}

export function wire() {
  $("diff-all").addEventListener("change", renderDiff);
  $("scatter-parameter").addEventListener("change", renderScatter);
}
