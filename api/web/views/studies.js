// Studies: the team's studies, and one study's table and plot; a study's points cancelled together.

import { api, refusal, request } from "../api.js";
import { $, act, add, button, cell, clock, percent } from "../dom.js";

/** The shell: navigate(page, arg) and me(). */
let app = null;
/** The study opened below the list, if any (`#/studies/ID`). */
let studyId = null;
/** The epochs finished by each point when the plot was last drawn: it is redrawn only when that changes. */
let plotDrawn = null;

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
    add(row, "td").appendChild(button(study.name || study.id, () => app.navigate("studies", study.id), { study: study.id }));
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
  const epochs = study.points.map((p) => p.test_error.length).join(",");
  if (plotDrawn !== epochs) {
    const response = await request(study.links.plot);
    if (!response.ok) throw await refusal(response);
    // the server's own SVG, parsed as XML and imported as nodes (no markup is ever assigned as HTML)
    const svg = new DOMParser().parseFromString(await response.text(), "image/svg+xml").documentElement;
    if (id !== studyId) return;
    $("study-plot").replaceChildren(document.importNode(svg, true));
    plotDrawn = epochs;
  }
}

function cancelStudy() {
  return act($("study-error"), async () => {
    await api(`/v1/studies/${studyId}/cancel`, { method: "POST" });
    await refresh();
  });
}

export function wire(shell) {
  app = shell;
  $("cancel-study").addEventListener("click", cancelStudy);
}
