// Jobs: the run history, filtered and paged, with live progress and the team's use of its quota; jobs are
// picked here to be compared.

import { api } from "../api.js";
import { $, act, add, button, cell, clock, percent } from "../dom.js";

/** The paging: the cursors of the pages before this one, this page's, and the next page's. */
const paging = { before: [], cursor: null, next: null };
/** The jobs ticked for comparing (kept across pages and refreshes). */
const selected = new Set();
/** The shell: navigate(page, arg) and me(). */
let app = null;

export const live = true;

/** A job's progress, or why it waits, or its outcome, in one line (the Job view uses it too). */
export function progressText(job) {
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

function query() {
  const query = new URLSearchParams({ limit: $("page-size").value });
  const after = $("after-filter").value;
  const before = $("before-filter").value;
  const filters = {
    state: $("state-filter").value,
    name_prefix: $("name-filter").value,
    created_after: after && `${after}T00:00:00Z`,
    // the whole day chosen: before the start of the next one
    created_before: before && new Date(Date.parse(`${before}T00:00:00Z`) + 864e5).toISOString(),
    cursor: paging.cursor,
  };
  for (const [name, value] of Object.entries(filters)) if (value) query.set(name, value);
  return query;
}

export async function refresh() {
  const [page, pool] = await Promise.all([api(`/v1/jobs?${query()}`), api("/v1/nodes")]);
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
    add(row, "td").appendChild(pick);
    add(row, "td").appendChild(button(job.name || job.id, () => app.navigate("job", job.id), { job: job.id }));
    cell(row, job.state).className = "state";
    // as the CLI says it: the devices held, and the workers when they are virtual ranks on fewer
    cell(row, job.devices === job.workers ? `${job.devices} ${job.device}` : `${job.devices} ${job.device} (${job.workers} workers)`);
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
  const me = app.me();
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

/** Another page or other filters: drawn now, a refusal (a filter the API rejects, say) shown. */
function reload() {
  return act($("jobs-error"), refresh);
}

function refilter() {
  paging.before = [];
  paging.cursor = null;
  return reload();
}

function compareSelected() {
  const ids = [...selected];
  if (ids.length < 2 || ids.length > 8) {
    $("jobs-error").textContent = "Select 2 to 8 jobs to compare.";
    return;
  }
  $("jobs-error").textContent = "";
  app.navigate("compare", ids);
}

export function wire(shell) {
  app = shell;
  $("job-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    refilter();
  });
  $("state-filter").addEventListener("change", refilter);
  $("page-size").addEventListener("change", refilter);
  $("older-page").addEventListener("click", () => {
    paging.before.push(paging.cursor);
    paging.cursor = paging.next;
    reload();
  });
  $("newer-page").addEventListener("click", () => {
    paging.cursor = paging.before.pop() ?? null;
    reload();
  });
  $("compare-selected").addEventListener("click", compareSelected);
}
