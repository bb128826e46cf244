// Compare: 2 to 8 jobs' recipes side by side and their curves overlaid, one colour each.

import { api, metricsOf } from "../api.js";
import { COLOURS, drawChart } from "../charts.js";
import { $, cell, percent } from "../dom.js";

/** The jobs compared, in the order they were picked. */
let ids = [];

export const live = true;

/** Compares the jobs `picked` (the Jobs view checks there are 2 to 8). */
export function open(picked) {
  if (picked !== undefined) ids = picked;
}

export async function refresh() {
  const shown = ids;
  const jobs = await Promise.all(shown.map((id) => api(`/v1/jobs/${id}`)));
  const [errors, losses, lrs] = await Promise.all([
    Promise.all(shown.map((id) => metricsOf(id, "epoch", "test_error"))),
    Promise.all(shown.map((id) => metricsOf(id, "iteration", "loss"))),
    Promise.all(shown.map((id) => metricsOf(id, "iteration", "lr"))),
  ]);
  if (shown !== ids) return;
  const rows = $("compare-rows");
  rows.replaceChildren();
  jobs.forEach((job, i) => {
    const e = job.effective || {};
    const row = document.createElement("tr");
    cell(row, job.name || job.id).style.color = COLOURS[i];
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

/** Nothing to wire: the view only shows. */
export function wire() {}
