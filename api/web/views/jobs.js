// Jobs: the run history as a table of runs, filtered (state, name, tag, text of the name or note, dates)
// and paged by the API, sorted here by any column, with metric columns (final and best test error,
// training time, kn, lr) and any spec field the user adds as a column; jobs are picked here to be compared.

import { api } from "../api.js";
import { $, act, add, button, cell, clock, duration, jobLink, linkedText, percent } from "../dom.js";

/** The paging: the cursors of the pages before this one, this page's, and the next page's. */
const paging = { before: [], cursor: null, next: null };
/** The jobs ticked for comparing (kept across pages and refreshes). */
const selected = new Set();
/** The shell: navigate(page, arg) and me(). */
let app = null;
/** The jobs of the page shown, as the API gave them. */
let shown = [];
/** The column the table is sorted by, and which way (1 ascending, -1 descending); null: newest first. */
let sorting = null;

/** Spec fields the user added as columns (dotted paths), kept in this browser. */
const COLUMNS_KEY = "ringtrain.columns";
let extraColumns = JSON.parse(localStorage.getItem(COLUMNS_KEY) || "[]");

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
    const left = p.seconds_left !== null && p.seconds_left !== undefined ? `, ${duration(Math.round(p.seconds_left))} left` : "";
    return `iteration ${p.iterations_done}${of}, epoch ${p.epoch + 1}${loss}${speed}${left}`;
  }
  if (job.result) return `test error ${percent(job.result.final_test_error)}`;
  return job.error ? job.error.split("\n")[0] : "";
}

/** Seconds a job has trained: from its start to its end (or now). */
function trainingSeconds(job) {
  if (!job.started_at) return null;
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  return Math.max(0, Math.round((end - Date.parse(job.started_at)) / 1000));
}

/** The lowest test error of any epoch of a finished run (null without epochs). */
export function bestTestError(job) {
  const errors = ((job.result && job.result.epochs) || []).map((e) => e.test_error).filter(Number.isFinite);
  return errors.length ? Math.min(...errors) : null;
}

/** The value at a dotted path of the spec (`optimizer.momentum`), or of the effective values (`effective.scaled_lr`). */
function specValue(job, path) {
  const [root, rest] = path.startsWith("effective.") ? [job.effective, path.slice(10)] : [job.spec, path];
  let value = root;
  for (const part of rest.split(".")) value = value === null || value === undefined ? undefined : value[part];
  return value;
}

/**
 * The table's columns: a key, a heading, the value sorted by, and how a cell shows it (text, or an
 * element).
 */
function columns() {
  const fixed = [
    { key: "name", title: "Name", value: (j) => j.name || j.id, show: (j) => jobLink(j.id, j.name || j.id) },
    { key: "state", title: "State", value: (j) => j.state, show: (j) => j.state, className: (j) => `state ${j.state}` },
    {
      key: "devices",
      title: "Devices",
      value: (j) => j.devices,
      // as the CLI says it: the devices held, and the workers when they are virtual ranks on fewer
      show: (j) => (j.devices === j.workers ? `${j.devices} ${j.device}` : `${j.devices} ${j.device} (${j.workers} workers)`),
    },
    { key: "progress", title: "Progress / waiting / outcome", value: progressText, show: progressText, linked: true },
    {
      key: "final",
      title: "Final test error",
      value: (j) => (j.result ? j.result.final_test_error : null),
      show: (j) => (j.result ? percent(j.result.final_test_error) : ""),
    },
    { key: "best", title: "Best test error", value: bestTestError, show: (j) => (bestTestError(j) === null ? "" : percent(bestTestError(j))) },
    {
      key: "time",
      title: "Training time",
      value: trainingSeconds,
      show: (j) => (trainingSeconds(j) === null ? "" : duration(trainingSeconds(j))),
    },
    { key: "kn", title: "kn", value: (j) => (j.effective ? j.effective.global_batch : null), show: (j) => (j.effective ? j.effective.global_batch : "") },
    {
      key: "lr",
      title: "lr",
      value: (j) => (j.effective ? j.effective.scaled_lr : null),
      show: (j) => (j.effective ? Number(j.effective.scaled_lr.toPrecision(4)) : ""),
    },
    { key: "tags", title: "Tags", value: (j) => j.tags.join(","), show: (j) => j.tags.join(", ") },
    { key: "created", title: "Created (UTC)", value: (j) => j.created_at, show: (j) => clock(j.created_at) },
  ];
  const extra = extraColumns.map((path) => ({
    key: `spec:${path}`,
    title: path,
    path,
    value: (j) => specValue(j, path) ?? null,
    show: (j) => {
      const v = specValue(j, path);
      return v === undefined ? "" : typeof v === "object" ? JSON.stringify(v) : String(v);
    },
  }));
  return [...fixed, ...extra];
}

function query() {
  const query = new URLSearchParams({ limit: $("page-size").value });
  const after = $("after-filter").value;
  const before = $("before-filter").value;
  const filters = {
    state: $("state-filter").value,
    name_prefix: $("name-filter").value,
    tag: $("tag-filter").value.trim(),
    q: $("text-filter").value.trim(),
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
  shown = page.jobs;
  renderTable();
  $("no-jobs").hidden = page.jobs.length > 0;
  paging.next = page.next_cursor;
  $("older-page").disabled = !page.next_cursor;
  $("newer-page").disabled = paging.before.length === 0;
  $("page-number").textContent = `page ${paging.before.length + 1}`;
  renderUsage(pool);
}

/** Compares two sort values: nulls last, numbers as numbers, the rest as text. */
function compareValues(a, b) {
  if (a === null || a === undefined) return b === null || b === undefined ? 0 : 1;
  if (b === null || b === undefined) return -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

function renderTable() {
  const all = columns();
  const head = $("job-head");
  head.replaceChildren();
  add(head, "th", "Compare");
  for (const column of all) {
    const th = add(head, "th");
    th.dataset.column = column.key;
    const sortedHere = sorting && sorting.key === column.key;
    th.setAttribute("aria-sort", sortedHere ? (sorting.way > 0 ? "ascending" : "descending") : "none");
    const sort = button(`${column.title}${sortedHere ? (sorting.way > 0 ? " ▲" : " ▼") : ""}`, () => sortBy(column.key), {
      sort: column.key,
    });
    sort.className = "link";
    th.appendChild(sort);
    if (column.path) {
      const remove = button("×", () => removeColumn(column.path), { removeColumn: column.path });
      remove.setAttribute("aria-label", `remove the column ${column.path}`);
      th.append(" ", remove);
    }
  }
  let jobs = shown;
  if (sorting) {
    const column = all.find((c) => c.key === sorting.key);
    if (column) jobs = [...shown].sort((a, b) => sorting.way * compareValues(column.value(a), column.value(b)));
  }
  const rows = $("job-rows");
  rows.replaceChildren();
  for (const job of jobs) {
    const row = document.createElement("tr");
    row.dataset.job = job.id;
    const pick = document.createElement("input");
    pick.type = "checkbox";
    pick.checked = selected.has(job.id);
    pick.dataset.job = job.id;
    pick.setAttribute("aria-label", `compare ${job.name || job.id}`);
    pick.addEventListener("change", () => (pick.checked ? selected.add(job.id) : selected.delete(job.id)));
    add(row, "td").appendChild(pick);
    for (const column of all) {
      const td = add(row, "td");
      td.dataset.column = column.key;
      const shownValue = column.show(job);
      if (shownValue instanceof Node) td.appendChild(shownValue);
      else if (column.linked) linkedText(td, String(shownValue));
      else td.textContent = String(shownValue);
      if (column.className) td.className = column.className(job);
    }
    rows.appendChild(row);
  }
}

/** Sorts by `key`: ascending first, then descending, then back to newest first. */
function sortBy(key) {
  if (!sorting || sorting.key !== key) sorting = { key, way: 1 };
  else if (sorting.way > 0) sorting = { key, way: -1 };
  else sorting = null;
  renderTable();
}

function addColumn(path) {
  if (!/^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$/.test(path)) {
    $("jobs-error").textContent = `"${path}" is not a spec path (dotted field names, as in optimizer.momentum).`;
    return;
  }
  $("jobs-error").textContent = "";
  if (!extraColumns.includes(path)) extraColumns = [...extraColumns, path];
  localStorage.setItem(COLUMNS_KEY, JSON.stringify(extraColumns));
  renderTable();
}

function removeColumn(path) {
  extraColumns = extraColumns.filter((p) => p !== path);
  localStorage.setItem(COLUMNS_KEY, JSON.stringify(extraColumns));
  if (sorting && sorting.key === `spec:${path}`) sorting = null;
  renderTable();
}

/** The devices the team holds now against its guarantee, from the pool's view of who holds what. */
function renderUsage(pool) {
  const me = app.me();
  const held = { gpu: 0, cpu: 0 };
  const pooled = { gpu: 0, cpu: 0 };
  for (const node of pool.nodes) {
    for (const device of node.devices) {
      pooled[device.kind] += 1;
      if (device.held_by && device.held_by.team_id === me.team_id) held[device.kind] += 1;
    }
  }
  // a guarantee above what the pool has is the pool (the quickstart team's 1024 on a 2-CPU machine)
  const part = (kind) => `${held[kind]} ${kind.toUpperCase()} of its ${Math.min(me[`${kind}_quota`], pooled[kind])} guaranteed`;
  $("team-usage").textContent =
    `Team ${me.team_name} holds ${part("gpu")} and ${part("cpu")} ` +
    `(the pool has ${pooled.gpu} GPU and ${pooled.cpu} CPU devices; idle devices beyond the guarantee may be borrowed).`;
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
  $("column-form").addEventListener("submit", (event) => {
    event.preventDefault();
    addColumn($("new-column").value.trim());
    $("new-column").value = "";
  });
}
