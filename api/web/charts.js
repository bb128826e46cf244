// Every chart of the page, drawn by hand as SVG: lines (or dots) over ticks at round values with
// gridlines, axis titles with units, a legend, the values under the pointer on hover, and a log scale where
// a chart offers one. One drawing code for the job's charts, the comparison, the editor's previews and the
// study plot. Written here rather than vendored (uPlot, Chart.js): what the page needs is about three
// hundred lines, against a library to audit and keep current (docs/ARCHITECTURE.md, "The web page").
//
// Text is only ever set through textContent. What a chart wrote (ticks, titles, legend) is also kept in
// its holder's `data-labels`, and how many series it drew in `data-series`, for tests and tools.

export const COLOURS = ["#2f6fd6", "#d6532f", "#2fa36b", "#8a4fd6", "#c99a00", "#1aa3b8", "#d62f8a", "#5b6472"];

const SVG = "http://www.w3.org/2000/svg";
/** The drawing's width when its holder has none yet (hidden); otherwise the holder's own, so that text keeps
 * its size however wide the column is. */
const DEFAULT_WIDTH = 560;
const PAD = { left: 70, right: 18, top: 14, bottom: 44 };
const MAX_POINTS = 2000;
const TICKS = 5;

/** What each holder last drew, to draw again when its log scale is switched. */
const drawn = new WeakMap();

/** At most MAX_POINTS of `points`, evenly spread, the last one kept. */
function thin(points) {
  if (points.length <= MAX_POINTS) return points;
  const step = points.length / MAX_POINTS;
  const kept = [];
  for (let i = 0; i < points.length; i += step) kept.push(points[Math.floor(i)]);
  kept.push(points[points.length - 1]);
  return kept;
}

/** `value` without float noise (0.30000000000000004 → 0.3). */
const clean = (value) => Number(value.toPrecision(12));

/** Ticks at round values (1, 2 or 5 × 10^n apart) covering [lo, hi], and the range they span. */
export function niceTicks(lo, hi, count = TICKS, integer = false) {
  if (!(hi > lo)) {
    const half = integer ? 0.5 : Math.abs(lo) / 10 || 0.5;
    return niceTicks(lo - half, hi + half, count, integer);
  }
  const rough = (hi - lo) / count;
  const magnitude = 10 ** Math.floor(Math.log10(rough));
  const fraction = rough / magnitude;
  let step = (fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10) * magnitude;
  if (integer) step = Math.max(1, Math.round(step));
  const first = Math.floor(lo / step) * step;
  const last = Math.ceil(hi / step) * step;
  const ticks = [];
  for (let v = first; v <= last + step / 2; v += step) ticks.push(clean(v));
  // integer axes (epochs) with a half-unit margin keep their ends where the data is
  if (integer && (lo % 1 !== 0 || hi % 1 !== 0)) {
    return { lo, hi, step, ticks: ticks.filter((t) => t >= lo && t <= hi) };
  }
  return { lo: clean(first), hi: clean(last), step, ticks };
}

/** Ticks of a log axis over [lo, hi] (both > 0): powers of ten, with 2 and 5 between when they are few. */
export function logTicks(lo, hi) {
  let first = Math.floor(Math.log10(lo));
  let last = Math.ceil(Math.log10(hi));
  if (last === first) last += 1;
  const ticks = [];
  const between = last - first <= 2 ? [1, 2, 5] : [1];
  for (let p = first; p <= last; p += 1) {
    for (const m of between) {
      const v = clean(m * 10 ** p);
      if (v >= 10 ** first && v <= 10 ** last) ticks.push(v);
    }
  }
  return { lo: 10 ** first, hi: 10 ** last, ticks };
}

/** A number as a tick label, with as many decimals as the step between ticks needs. */
export function formatNumber(value, step = 0) {
  const magnitude = Math.abs(value);
  if (magnitude >= 1e6) return `${clean(value / 1e6)}M`;
  if (magnitude >= 1e4) return `${clean(value / 1e3)}k`;
  if (value !== 0 && magnitude < 1e-3) return value.toExponential(1);
  const decimals = step > 0 ? Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9))) : 4;
  return String(clean(Number(value.toFixed(decimals))));
}

/** How an axis writes its values: `number` (the default), `percent` (fractions as %), `bytes`. */
function formatter(kind) {
  if (kind === "percent") return (v, step) => `${formatNumber(v * 100, step * 100)}%`;
  if (kind === "bytes") return (v) => `${formatNumber(v / 2 ** 20, 1)} MiB`;
  return formatNumber;
}

function svg(tag, attributes, parent) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, String(value));
  if (parent) parent.appendChild(element);
  return element;
}

/** The points of a series ready to draw: finite, sorted by x, positive on a log axis. */
function usable(points, log) {
  return thin(
    points
      .filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y) && (!log || y > 0))
      .sort((a, b) => a[0] - b[0]),
  );
}

/**
 * Draws `series` ([{label, points: [[x, y], ...], colour?, dashed?, dots?}]) into `holder` (a div), scaled
 * together. `axes`: `x` and `y` (titles, with their units), `yFormat` (`number`, `percent`, `bytes`),
 * `xInteger` (ticks at whole values: epochs), `yFromZero`, `log` (start on a log scale) and `logToggle`
 * (offer the switch), `height` (240 by default), `empty` (what to say when there is nothing to draw).
 */
export function drawChart(holder, series, axes) {
  drawn.set(holder, { series, axes });
  const log = holder.dataset.log ? holder.dataset.log === "true" : Boolean(axes.log);
  const height = axes.height || 240;
  const written = [];
  holder.replaceChildren();
  const width = Math.max(320, Math.round(holder.clientWidth || DEFAULT_WIDTH));
  holder.classList.add("chart");
  if (axes.logToggle) {
    const label = document.createElement("label");
    label.className = "log-toggle";
    const box = label.appendChild(document.createElement("input"));
    box.type = "checkbox";
    box.checked = log;
    box.addEventListener("change", () => {
      holder.dataset.log = String(box.checked);
      const last = drawn.get(holder);
      drawChart(holder, last.series, last.axes);
    });
    label.append(" log scale");
    holder.appendChild(label);
  }
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", class: "plot" }, holder);
  if (holder.getAttribute("aria-label")) root.setAttribute("aria-label", holder.getAttribute("aria-label"));
  const write = (text, x, y, anchor = "start", extra = {}) => {
    const element = svg("text", { x, y, "text-anchor": anchor, ...extra }, root);
    element.textContent = text;
    written.push(text);
    return element;
  };
  const lines = series
    .map((s, i) => ({ ...s, colour: s.colour || COLOURS[i % COLOURS.length], points: usable(s.points, log) }))
    .filter((s) => s.points.length > 0);
  const all = lines.flatMap((s) => s.points);
  if (all.length === 0) {
    write(axes.empty || "nothing reported yet", width / 2, height / 2, "middle", { class: "empty" });
    holder.dataset.labels = written.join("|");
    holder.dataset.series = "0";
    return;
  }
  const xs = all.map((p) => p[0]);
  const ys = all.map((p) => p[1]);
  const xScale = niceTicks(Math.min(...xs), Math.max(...xs), TICKS, Boolean(axes.xInteger));
  let yLo = Math.min(...ys);
  if (axes.yFromZero && !log) yLo = Math.min(0, yLo);
  const yScale = log ? logTicks(yLo, Math.max(...ys)) : niceTicks(yLo, Math.max(...ys));
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const sx = (x) => PAD.left + ((x - xScale.lo) / (xScale.hi - xScale.lo)) * plotW;
  const toY = log ? Math.log10 : (v) => v;
  const sy = (y) => PAD.top + plotH - ((toY(y) - toY(yScale.lo)) / (toY(yScale.hi) - toY(yScale.lo))) * plotH;
  const formatY = formatter(axes.yFormat);

  // grid, ticks and titles
  const grid = svg("g", { class: "grid" }, root);
  for (const t of yScale.ticks) {
    svg("line", { x1: PAD.left, x2: PAD.left + plotW, y1: sy(t), y2: sy(t) }, grid);
    write(formatY(t, yScale.step || t), PAD.left - 6, sy(t) + 4, "end", { class: "tick" });
  }
  for (const t of xScale.ticks) {
    svg("line", { x1: sx(t), x2: sx(t), y1: PAD.top, y2: PAD.top + plotH }, grid);
    write(formatNumber(t, xScale.step), sx(t), PAD.top + plotH + 16, "middle", { class: "tick" });
  }
  svg("rect", { x: PAD.left, y: PAD.top, width: plotW, height: plotH, class: "frame" }, root);
  write(axes.x, PAD.left + plotW / 2, height - 6, "middle", { class: "title" });
  const yTitle = write(log ? `${axes.y} (log scale)` : axes.y, 0, 0, "middle", { class: "title" });
  yTitle.setAttribute("transform", `translate(14 ${PAD.top + plotH / 2}) rotate(-90)`);

  // the series
  for (const line of lines) {
    const group = svg("g", { class: "series", stroke: line.colour, fill: line.colour }, root);
    if (line.points.length > 1 && !line.dots) {
      const d = line.points.map(([x, y], j) => `${j ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
      const path = svg("path", { d, fill: "none", "stroke-width": line.dashed ? 1.5 : 2 }, group);
      if (line.dashed) path.setAttribute("stroke-dasharray", "6 4");
    } else {
      // one point so far (one epoch), or a scatter: dots
      for (const [x, y] of line.points) svg("circle", { cx: sx(x), cy: sy(y), r: 4 }, group);
    }
  }
  holder.dataset.series = String(lines.length);

  // the legend, below the plot (HTML: it wraps)
  if (lines.some((l) => l.label)) {
    const legend = document.createElement("ul");
    legend.className = "legend";
    for (const line of lines.filter((l) => l.label)) {
      const item = legend.appendChild(document.createElement("li"));
      const swatch = item.appendChild(document.createElement("span"));
      swatch.className = line.dashed ? "swatch dashed" : "swatch";
      swatch.style.borderColor = line.colour;
      item.append(line.label);
      written.push(line.label);
    }
    holder.appendChild(legend);
  }
  holder.dataset.labels = written.join("|");
  const xAt = (px) => xScale.lo + ((px - PAD.left) / plotW) * (xScale.hi - xScale.lo);
  const formatX = (x) => formatNumber(x, axes.xInteger ? 1 : xScale.step / 10);
  hover(holder, root, lines, { sx, sy, xAt, plotW, plotH, formatY, formatX });
}

/** The values under the pointer: a rule at the nearest x, a dot on each series and a box of their values. */
function hover(holder, root, lines, scale) {
  const rule = svg("line", { class: "rule", y1: PAD.top, y2: PAD.top + scale.plotH, visibility: "hidden" }, root);
  const marks = lines.map((line) => svg("circle", { r: 4, fill: line.colour, visibility: "hidden" }, root));
  const box = document.createElement("div");
  box.className = "tooltip";
  box.hidden = true;
  holder.appendChild(box);
  const area = svg("rect", { x: PAD.left, y: PAD.top, width: scale.plotW, height: scale.plotH, class: "hover-area" }, root);
  const nearest = (points, x) => {
    let [lo, hi] = [0, points.length - 1];
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (points[mid][0] < x) lo = mid;
      else hi = mid;
    }
    return Math.abs(points[lo][0] - x) <= Math.abs(points[hi][0] - x) ? points[lo] : points[hi];
  };
  area.addEventListener("pointermove", (event) => {
    const point = root.createSVGPoint();
    point.x = event.clientX;
    point.y = event.clientY;
    const x = scale.xAt(point.matrixTransform(root.getScreenCTM().inverse()).x);
    const found = lines.map((line) => nearest(line.points, x));
    const shownX = found[0][0];
    rule.setAttribute("x1", scale.sx(shownX));
    rule.setAttribute("x2", scale.sx(shownX));
    rule.setAttribute("visibility", "visible");
    found.forEach(([px, py], i) => {
      marks[i].setAttribute("cx", scale.sx(px));
      marks[i].setAttribute("cy", scale.sy(py));
      marks[i].setAttribute("visibility", "visible");
    });
    box.replaceChildren();
    const head = box.appendChild(document.createElement("div"));
    head.textContent = `${scale.formatX(shownX)}`;
    found.forEach(([px, py], i) => {
      const row = box.appendChild(document.createElement("div"));
      const name = lines[i].label ? `${lines[i].label}: ` : "";
      const where = px === shownX ? "" : ` (at ${scale.formatX(px)})`;
      // four significant digits of the value itself, not the axis's rounding
      row.textContent = `${name}${scale.formatY(py, Math.abs(py) / 1000 || 1e-9)}${where}`;
      row.style.color = lines[i].colour;
    });
    box.hidden = false;
    const bounds = holder.getBoundingClientRect();
    const left = event.clientX - bounds.left + 12;
    box.style.left = `${Math.min(left, bounds.width - box.offsetWidth - 4)}px`;
    box.style.top = `${event.clientY - bounds.top + 12}px`;
  });
  area.addEventListener("pointerleave", () => {
    box.hidden = true;
    rule.setAttribute("visibility", "hidden");
    for (const mark of marks) mark.setAttribute("visibility", "hidden");
  });
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
