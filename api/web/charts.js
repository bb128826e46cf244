// Line charts on a canvas, drawn by hand rather than with a charting library: the page needs lines, two
// axes and a legend, which is about a hundred lines here, against vendoring and auditing a library (uPlot is
// ~50 KB) that would also need its licence and version kept up to date (docs/ARCHITECTURE.md, "The web page").

export const COLOURS = ["#2f6fd6", "#d6532f", "#2fa36b", "#8a4fd6", "#c99a00", "#1aa3b8", "#d62f8a", "#5b6472"];

const PAD = { left: 64, right: 16, top: 26, bottom: 34 };
const MAX_POINTS = 2000;

/** At most MAX_POINTS of `points`, evenly spread, the last one kept. */
function thin(points) {
  if (points.length <= MAX_POINTS) return points;
  const step = points.length / MAX_POINTS;
  const kept = [];
  for (let i = 0; i < points.length; i += step) kept.push(points[Math.floor(i)]);
  kept.push(points[points.length - 1]);
  return kept;
}

function label(value) {
  if (value === 0) return "0";
  const magnitude = Math.abs(value);
  return magnitude >= 1e4 || magnitude < 1e-3 ? value.toExponential(2) : String(Number(value.toPrecision(4)));
}

/**
 * Draws `series` ([{label, points: [[x, y], ...], colour?, dashed?}]) scaled together, with the axes named
 * `axes.x` and `axes.y`, ticks at both ends and a legend when a series has a label. What was written on
 * the canvas is also kept in its `data-labels` attribute (a canvas's text cannot be read back).
 */
export function drawChart(canvas, series, axes) {
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  ctx.fillStyle = "#1d2430";
  ctx.font = "12px system-ui, sans-serif";
  const written = [];
  const write = (text, x, y, align = "left") => {
    ctx.textAlign = align;
    ctx.fillText(text, x, y);
    written.push(text);
  };
  const lines = series
    .map((s) => ({ ...s, points: thin(s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y))) }))
    .filter((s) => s.points.length > 0);
  const all = lines.flatMap((s) => s.points);
  if (all.length < 2) {
    write(axes.empty || "nothing reported yet", 10, 20);
    canvas.dataset.labels = written.join("|");
    canvas.dataset.series = "0";
    return;
  }
  let [x0, x1, y0, y1] = [Infinity, -Infinity, Infinity, -Infinity];
  for (const [x, y] of all) {
    x0 = Math.min(x0, x);
    x1 = Math.max(x1, x);
    y0 = Math.min(y0, y);
    y1 = Math.max(y1, y);
  }
  if (axes.yFromZero) y0 = Math.min(0, y0);
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0 || 1)) * plotW;
  const sy = (y) => PAD.top + plotH - ((y - y0) / (y1 - y0 || 1)) * plotH;
  ctx.strokeStyle = "#98a2b3";
  ctx.lineWidth = 1;
  ctx.setLineDash([]);
  ctx.strokeRect(PAD.left, PAD.top, plotW, plotH);
  write(axes.y, 4, 14);
  write(label(y1), PAD.left - 4, PAD.top + 10, "right");
  write(label(y0), PAD.left - 4, PAD.top + plotH, "right");
  write(label(x0), PAD.left, height - PAD.bottom + 14);
  write(label(x1), PAD.left + plotW, height - PAD.bottom + 14, "right");
  write(axes.x, PAD.left + plotW / 2, height - 4, "center");
  let legendX = PAD.left + plotW;
  lines.forEach((line, i) => {
    const colour = line.colour || COLOURS[i % COLOURS.length];
    ctx.strokeStyle = colour;
    ctx.lineWidth = line.dashed ? 1.5 : 2;
    ctx.setLineDash(line.dashed ? [6, 4] : []);
    ctx.beginPath();
    line.points.forEach(([x, y], j) => (j ? ctx.lineTo(sx(x), sy(y)) : ctx.moveTo(sx(x), sy(y))));
    ctx.stroke();
    ctx.fillStyle = colour;
    // a single point (one epoch so far) is a dot
    if (line.points.length === 1) ctx.fillRect(sx(line.points[0][0]) - 3, sy(line.points[0][1]) - 3, 6, 6);
    if (line.label) {
      write(line.label, legendX, 14, "right");
      legendX -= ctx.measureText(line.label).width + 14;
      ctx.fillStyle = "#1d2430";
    }
  });
  ctx.setLineDash([]);
  canvas.dataset.labels = written.join("|");
  canvas.dataset.series = String(lines.length);
}

/** The lr of every iteration of a schedule view: its `per_iteration` list, else from its change points. */
export function plannedLr(schedule) {
  if (schedule.per_iteration) return schedule.per_iteration.map((lr, i) => [i, lr]);
  // Phases that hold their lr (constant warmup, constant, a step) end in a flat line before the next point;
  // a gradual warmup ramps to it (a cosine is drawn as a straight line between its points: an outline).
  const holds = (c) => c.phase.kind === "constant" || c.phase.kind === "step_decay" || c.phase.shape === "constant";
  const points = [];
  schedule.change_points.forEach((c, i) => {
    const before = schedule.change_points[i - 1];
    if (before && holds(before) && c.iteration > before.iteration) points.push([c.iteration - 1, before.lr]);
    points.push([c.iteration, c.lr]);
  });
  const last = schedule.change_points[schedule.change_points.length - 1];
  if (last) points.push([schedule.effective.total_iterations - 1, holds(last) ? last.lr : points[points.length - 1][1]]);
  return points;
}
