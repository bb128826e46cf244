// Studies: the team's studies, and one study's table and plot (drawn here with the page's charts; the
// server's SVG of the same plot, which `ringtrain study --out` writes, can be downloaded); a study's points
// cancelled together; a search's standing per point and what it found.

import { api, refusal, request } from "../api.js";
import { COLOURS, drawChart } from "../charts.js";
import { $, act, add, cell, clock, jobLink, percent } from "../dom.js";

/** The study opened below the list, if any (`#/studies/ID`). */
let studyId = null;
/** The epochs finished by each point when the plot was last drawn: it is redrawn only when that changes. */
let plotDrawn = null;
/** The study shown, as last fetched. */
let shownStudy = null;

export const live = true;

function statesText(states) {
  return Object.entries(states || {})
    .map(([state, n]) => `${n} ${state}`)
    .join(", ");
}

export async function refresh() {
  const page = await api("/v1/studies?limit=100");
  const rows = $("study-rows");
  rows.replaceChildren();
  for (const study of page.studies) {
    const row = document.createElement("tr");
    const link = add(row, "td").appendChild(document.createElement("a"));
    link.href = `#/studies/${study.id}`;
    link.dataset.study = study.id;
    link.textContent = study.name || study.id;
    cell(row, study.points);
    cell(row, statesText(study.states));
    cell(row, clock(study.created_at));
    rows.appendChild(row);
  }
  $("no-studies").hidden = page.studies.length > 0;
  if (studyId) await act($("study-error"), renderStudy);
}

/** Opens study `id` below the list (its address is `#/studies/ID`), or none. */
export function open(id) {
  studyId = id || null;
  plotDrawn = null;
  $("study-detail").hidden = true;
  $("study-error").textContent = "";
}

async function renderStudy() {
  const id = studyId;
  const study = await api(`/v1/studies/${id}`);
  if (id !== studyId) return;
  $("study-detail").hidden = false;
  $("study-title").textContent = `${study.name || study.id}: ${statesText(study.states)}`;
  const rows = $("study-point-rows");
  rows.replaceChildren();
  const orDash = (value, format) => (value === null || value === undefined ? "-" : format(value));
  for (const p of study.points) {
    const row = document.createElement("tr");
    row.dataset.point = p.point;
    add(row, "td").appendChild(jobLink(p.job_id, `${p.point}${p.is_reference ? "*" : ""}`));
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
    cell(row, p.search ?? "-");
    cell(row, rungsText(p));
    rows.appendChild(row);
  }
  showSearch(study);
  const ended = ["succeeded", "failed", "cancelled", "stopped"];
  $("cancel-study").hidden = study.points.every((p) => ended.includes(p.state));
  shownStudy = study;
  const epochs = study.points.map((p) => `${p.train_error.length}/${p.test_error.length}`).join(",");
  if (plotDrawn !== epochs) {
    drawPlot(study);
    plotDrawn = epochs;
  }
}

/** A point's figure at each rung it reached, "↑" where it was promoted past the rung: "21.30% ↑ · 18.02%". */
function rungsText(p) {
  if (!p.at_rungs || p.at_rungs.length === 0) return "-";
  return p.at_rungs.map((figure, rung) => `${percent(figure)}${rung < p.rungs_passed ? " ↑" : ""}`).join(" · ");
}

/** What the study's search found: the best point, its multiplier, device-hours spent and saved, its spec. */
function showSearch(study) {
  const search = study.search;
  $("study-search").hidden = !search;
  if (!search) return;
  const hours = (h) => (h === null || h === undefined ? "?" : h.toFixed(3));
  const best = study.points.find((p) => p.point === search.best_point);
  const found = best
    ? ` Best so far: point ${best.point} (${best.label})` +
      (search.best_multiplier ? `, lr multiplier ${search.best_multiplier}` : "") +
      `, test error ${percent(best.final_test_error ?? best.test_error[best.test_error.length - 1])}` +
      ` (${best.final_test_error === null ? "so far" : "final"}).`
    : " No point has reached a rung yet.";
  $("study-search-text").textContent =
    `Search ${search.done ? "done" : "running"}: ${hours(search.device_hours)} device-hours spent of the ` +
    `full grid's ${hours(search.grid_device_hours)} (saved ${hours(search.saved_device_hours)}).${found}`;
  $("study-best-spec").textContent = search.best_spec ? JSON.stringify(search.best_spec, null, 2) : "";
}

/** Every point's error per epoch: test solid, training dashed, one colour a point (the reference starred). */
function drawPlot(study) {
  const series = study.points.flatMap((p, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const name = `${p.point}${p.is_reference ? "*" : ""} ${p.label}`;
    const perEpoch = (errors) => errors.map((error, epoch) => [epoch + 1, error]);
    return [
      { label: `${name} test`, points: perEpoch(p.test_error), colour },
      { label: `${name} train`, points: perEpoch(p.train_error), colour, dashed: true },
    ];
  });
  drawChart($("study-plot"), series, {
    x: "epoch",
    y: "error (%)",
    yFormat: "percent",
    xInteger: true,
    yFromZero: true,
    height: 320,
    empty: "no point has finished an epoch yet",
  });
}

/** The server's SVG of the plot, fetched with the token and saved from memory. */
function downloadPlot() {
  return act($("study-error"), async () => {
    if (!shownStudy) return;
    const response = await request(shownStudy.links.plot);
    if (!response.ok) throw await refusal(response);
    const link = document.createElement("a");
    link.href = URL.createObjectURL(await response.blob());
    link.download = `${shownStudy.name || shownStudy.id}.svg`;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
  });
}

function cancelStudy() {
  if (!window.confirm("Cancel every point of this study that has not ended?")) return undefined;
  return act($("study-error"), async () => {
    await api(`/v1/studies/${studyId}/cancel`, { method: "POST" });
    await refresh();
  });
}

export function wire() {
  $("cancel-study").addEventListener("click", cancelStudy);
  $("study-svg").addEventListener("click", downloadPlot);
}
