// Submit: the editor, checked on every edit (field errors at their paths, the scheduler's verdict), and the
// schedule previewed for several worker counts; a submitted job opens in the Job view.

import { api } from "../api.js";
import { COLOURS, drawChart, plannedLr } from "../charts.js";
import { $, add } from "../dom.js";

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
/** The worker counts the schedule is previewed for. */
const PREVIEW_WORKERS = [1, 2, 8, 32];

/** The check waiting for typing to pause. */
let checkTimer = null;
/** Checks overlap (each edit starts one): only the newest may write its answer. */
let checkSeq = 0;
/** The shell: navigate(page, arg) and me(). */
let app = null;

/** Drawn once per visit (a check), not every two seconds: the editor is being typed into. */
export const live = false;

/** Opens the editor, with `spec` in it when one is given ("Submit again"). */
export function open(spec) {
  if (spec !== undefined) $("spec").value = JSON.stringify(spec, null, 2);
}

export function refresh() {
  return check();
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
  $("verdict").classList.add("error");
  // the last good spec's schedules beside this one's problems would mislead
  const charts = $("preview-charts");
  charts.replaceChildren();
  add(charts, "p", "No preview while the spec has problems.");
  $("spec-stages").replaceChildren();
  const list = $("spec-errors");
  list.replaceChildren();
  for (const field of error.fields || []) add(list, "li", `${field.path}: ${field.reason}`).dataset.path = field.path;
}

async function check() {
  const mine = ++checkSeq;
  try {
    const spec = specFromEditor();
    const answer = await api("/v1/jobs?dry_run=true", { method: "POST", body: JSON.stringify(spec) });
    const preview = await previewSchedules(spec);
    if (mine !== checkSeq) return;
    $("spec-errors").replaceChildren();
    $("verdict").classList.remove("error");
    $("verdict").textContent = `${answer.verdict}: ${answer.message}`;
    renderStages(answer.stages || []);
    renderPreview(preview);
  } catch (error) {
    if (mine === checkSeq) showErrors(error);
  }
}

/** A split model's stages, as the dry run estimates them: "stage 1: layer3.0 to layer3.2, 1 micro-batch at
 * once, about 120 MiB". */
function renderStages(stages) {
  const list = $("spec-stages");
  list.replaceChildren();
  const mib = (bytes) => `${Math.max(1, Math.round(bytes / 2 ** 20))} MiB`;
  stages.forEach((stage, s) => {
    const [first, last] = stage.blocks;
    const held = first === last ? first : `${first} to ${last}`;
    const micro = `${stage.in_flight} micro-batch${stage.in_flight === 1 ? "" : "es"} at once`;
    add(list, "li", `stage ${s}: ${held}, ${micro}, about ${mib(stage.memory.total)}`);
  });
}

/** The spec's schedule for each of PREVIEW_WORKERS, or {error} when it cannot be previewed. */
async function previewSchedules(spec) {
  const workers = PREVIEW_WORKERS.join(",");
  const body = JSON.stringify(spec);
  try {
    return await api(`/v1/schedules/preview?workers=${workers}&per_iteration=true`, { method: "POST", body });
  } catch {
    // too many iterations to list: the change points draw the same shape
    return api(`/v1/schedules/preview?workers=${workers}`, { method: "POST", body }).catch((error) => ({ error }));
  }
}

function renderPreview(answer) {
  const charts = $("preview-charts");
  charts.replaceChildren();
  if (answer.error) {
    const reasons = (answer.error.fields || []).map((f) => `${f.path}: ${f.reason}`).join("; ");
    add(charts, "p", `No preview: ${reasons || answer.error.message}`);
    return;
  }
  for (const { workers: k, schedule } of answer.schedules) {
    const e = schedule.effective;
    const figure = add(charts, "figure");
    figure.dataset.workers = k;
    add(
      figure,
      "figcaption",
      `k = ${k}: batch ${e.global_batch}, lr ${Number(e.scaled_lr.toPrecision(4))}, ` +
        `warmup ${e.warmup_iterations} of ${e.total_iterations} iterations`,
    );
    if (e.warmup_skipped) add(figure, "p", e.warmup_skipped);
    const chart = add(figure, "div");
    chart.setAttribute("role", "img");
    chart.setAttribute("aria-label", `learning rate per epoch with ${k} workers`);
    const perEpoch = e.iterations_per_epoch || 1;
    const points = plannedLr(schedule).map(([i, lr]) => [i / perEpoch, lr]);
    drawChart(chart, [{ points, colour: COLOURS[PREVIEW_WORKERS.indexOf(k) % COLOURS.length] }], {
      x: "epoch",
      y: "learning rate",
      yFromZero: true,
      height: 220,
      empty: `${e.total_iterations} iteration${e.total_iterations === 1 ? "" : "s"}: no curve to draw`,
    });
  }
}

async function send() {
  try {
    const job = await api("/v1/jobs", {
      method: "POST",
      body: JSON.stringify(specFromEditor()),
      headers: { "Idempotency-Key": crypto.randomUUID() },
    });
    $("spec-errors").replaceChildren();
    $("verdict").textContent = `submitted ${job.id}`;
    app.navigate("job", job.id);
  } catch (error) {
    showErrors(error);
  }
}

export function wire(shell) {
  app = shell;
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
  $("check").addEventListener("click", check);
  $("send").addEventListener("click", send);
}
