// Line charts on uPlot for the run page and the compare page: series as the REST API serves them ([x, value]
// points, each bin's lowest and highest), drawn on a step / tokens / wall-time axis, optionally log-scaled and
// smoothed; dragging across a chart asks its owner (onZoom) for the range, which fetches finer data for it.
"use strict";
const WorkbenchCharts = (() => {
  // Distinguishable for the common colour-vision deficiencies (after Okabe and Ito), dark enough on white.
  const PALETTE = ["#0b57b8", "#c2410c", "#15803d", "#7e22ce", "#a16207", "#0e7490", "#be123c", "#4a5563",
                   "#4d7c0f", "#1e3a8a"];
  const HEIGHT = 230;
  const X_LABELS = {step: "step", tokens: "tokens seen", time: "wall time"};
  const X_UNITS = {step: "steps", tokens: "tokens", time: "seconds"};

  function compact(value) {
    const size = Math.abs(value);
    for (const [limit, suffix] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "k"]]) {
      if (size >= limit) return `${Number((value / limit).toPrecision(3))}${suffix}`;
    }
    return Number(value.toPrecision(4)).toString();
  }

  function duration(seconds) {
    const s = Math.max(0, seconds);
    if (s < 60) return `${Number(s.toPrecision(3))} s`;
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), rest = Math.floor(s % 60);
    return h ? `${h} h ${String(m).padStart(2, "0")} m` : `${m} m ${String(rest).padStart(2, "0")} s`;
  }

  function formatX(unit, value) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    if (unit === "time") return duration(value);
    if (unit === "tokens") return compact(value);
    return Math.round(value).toLocaleString("en-US");
  }

  function bytes(value) {
    let size = value, unit = "B";
    for (unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
      if (Math.abs(size) < 1024 || unit === "TiB") break;
      size /= 1024;
    }
    return `${Number(size.toPrecision(3))} ${unit}`;
  }

  function formatY(unit, value) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    if (unit === "bytes") return bytes(value);
    if (unit === "fraction") return `${Number((100 * value).toPrecision(3))}%`;
    if (unit === "tokens/s") return compact(value);
    return Workbench.number(value, 4);
  }

  // A downsampled series holds each bin's lowest and highest point; smoothing works on one point a bin, their
  // midpoint (mean x, mean of the two values), so that the spread inside a bin does not read as noise. A series
  // served whole (not downsampled) is used point by point.
  function midpoints(points, frame, downsampled) {
    if (!downsampled || !frame || !(frame.bin_width > 0)) return points.map(p => [p[0], p[1]]);
    const bins = new Map();
    for (const [x, y] of points) {
      const i = Math.min(Math.floor((x - frame.start) / frame.bin_width), frame.bins - 1);
      const bin = bins.get(i);
      if (bin) { bin.x += x; bin.n += 1; bin.low = Math.min(bin.low, y); bin.high = Math.max(bin.high, y); }
      else bins.set(i, {x, n: 1, low: y, high: y});
    }
    return [...bins.entries()].sort((a, b) => a[0] - b[0]).map(([, b]) => [b.x / b.n, (b.low + b.high) / 2]);
  }

  // Smoothing with a window in x units (steps, tokens or seconds), not in points: the value at x is the mean of
  // the midpoints within x ± window/2, each weighted by the stretch of x it stands for (half the gap to each
  // neighbour). Zoomed out, a midpoint stands for a wide bin and weighs as much; zoomed in, each step weighs one
  // step. The weighted mean approximates the curve's mean over the window, so the same window gives the same
  // curve at every zoom level and on every run of a comparison, however densely each is sampled.
  function smooth(points, window) {
    const n = points.length;
    if (!(window > 0) || n < 2) return points.slice();
    const weight = points.map((p, i) => {
      const left = i > 0 ? (p[0] - points[i - 1][0]) / 2 : 0;
      const right = i < n - 1 ? (points[i + 1][0] - p[0]) / 2 : 0;
      return Math.max(left + right, 1e-12);
    });
    const sumW = [0], sumWY = [0];
    for (let i = 0; i < n; i++) {
      sumW.push(sumW[i] + weight[i]);
      sumWY.push(sumWY[i] + weight[i] * points[i][1]);
    }
    const half = window / 2, out = [];
    let low = 0, high = 0;
    for (let i = 0; i < n; i++) {
      const x = points[i][0];
      while (high < n && points[high][0] <= x + half) high++;
      while (points[low][0] < x - half) low++;
      out.push([x, (sumWY[high] - sumWY[low]) / (sumW[high] - sumW[low])]);
    }
    return out;
  }

  // uPlot draws series over one shared x array: the union of every line's x, a line null where it has no point
  // (drawn across with spanGaps).
  function align(lines) {
    const xs = [...new Set(lines.flatMap(line => line.map(p => p[0])))].sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    return [xs, ...lines.map(line => {
      const ys = new Array(xs.length).fill(null);
      for (const [x, y] of line) ys[index.get(x)] = y;
      return ys;
    })];
  }

  function sorted(points) {
    return points.slice().sort((a, b) => a[0] - b[0]);
  }

  class Chart {
    // el: the container (its data-points is set to the points drawn); options: yUnit ("", "bytes", "fraction",
    // "tokens/s"), summary (an element for the text summary), empty (what the summary says with nothing to draw;
    // by default that nothing is drawn yet), syncKey (charts that share a cursor), onZoom(start, end) called with
    // the x range dragged across.
    constructor(el, options = {}) {
      this.el = el;
      this.options = options;
      this.plot = null;
      this.key = "";
      this.resize = new ResizeObserver(() => {
        if (this.plot) this.plot.setSize({width: this.width(), height: HEIGHT});
      });
      this.resize.observe(el);
    }

    width() {
      return Math.max(240, Math.floor(this.el.clientWidth || this.el.parentElement.clientWidth || 480));
    }

    // lines: [{label, points, frame, downsampled, count}]; x: the x unit; log: log-scaled y; smoothing: the
    // window in x units (0: none).
    draw({lines, x = "step", log = false, smoothing = 0}) {
      const yUnit = this.options.yUnit || "";
      const shown = lines.map(line => ({...line, points: sorted(line.points || []).filter(p =>
        p[1] !== null && Number.isFinite(p[1]) && (!log || p[1] > 0))}));
      const drawn = shown.reduce((sum, line) => sum + line.points.length, 0);
      this.el.dataset.points = String(drawn);
      this.el.dataset.series = String(shown.filter(line => line.points.length).length);
      if (!drawn) {
        this.destroy();
        this.summarize(this.options.empty || "No data to draw yet.");
        return;
      }
      const series = [{label: X_LABELS[x], value: (u, v) => formatX(x, v)}];
      const data = [];
      shown.forEach((line, i) => {
        if (!line.points.length) return;
        const color = PALETTE[i % PALETTE.length];
        const value = (u, v) => formatY(yUnit, v);
        if (smoothing > 0) {
          series.push({label: line.label, stroke: `${color}59`, width: 1, spanGaps: true, value});
          series.push({label: `${line.label} (smoothed)`, stroke: color, width: 2, spanGaps: true, value});
          data.push(line.points, smooth(midpoints(line.points, line.frame, line.downsampled), smoothing));
        } else {
          series.push({label: line.label, stroke: color, width: 1.5, spanGaps: true, value});
          data.push(line.points);
        }
      });
      const aligned = align(data);
      const key = JSON.stringify([x, log, yUnit, series.map(s => s.label)]);
      if (this.plot && key === this.key) {
        this.plot.setData(aligned);
      } else {
        this.destroy();
        this.key = key;
        this.plot = new uPlot(this.uplotOptions(series, x, log, yUnit), aligned, this.el);
      }
      this.summarize(this.describe(shown, x, smoothing, yUnit));
    }

    uplotOptions(series, x, log, yUnit) {
      const onZoom = this.options.onZoom;
      return {
        width: this.width(), height: HEIGHT, series,
        scales: {x: {time: false}, y: log ? {distr: 3, log: 10} : {}},
        axes: [{values: (u, splits) => splits.map(v => formatX(x, v)), size: 40},
               {values: (u, splits) => splits.map(v => formatY(yUnit, v)), size: 72}],
        cursor: {drag: {x: true, y: false, setScale: false},
                 ...(this.options.syncKey ? {sync: {key: this.options.syncKey}} : {})},
        legend: {live: true},
        hooks: {setSelect: [u => {
          const {left, width} = u.select;
          if (width < 3 || !onZoom) return;
          const start = u.posToVal(left, "x"), end = u.posToVal(left + width, "x");
          u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
          onZoom(Math.min(start, end), Math.max(start, end));
        }]},
      };
    }

    describe(lines, x, smoothing, yUnit) {
      const parts = lines.filter(line => line.points.length).map(line => {
        const values = line.points.map(p => p[1]);
        const [lastX, lastY] = line.points[line.points.length - 1];
        const held = line.downsampled ? ` (each bin's lowest and highest of ${line.count.toLocaleString("en-US")})` : "";
        return `${line.label}: ${line.points.length} points${held} from ${X_LABELS[x]} ${formatX(x, line.points[0][0])} ` +
          `to ${formatX(x, lastX)}, lowest ${formatY(yUnit, Math.min(...values))}, highest ` +
          `${formatY(yUnit, Math.max(...values))}, last ${formatY(yUnit, lastY)}.`;
      });
      if (smoothing > 0) parts.push(`Smoothed over ${formatX(x, smoothing)} ${x === "time" ? "" : X_UNITS[x]}.`);
      return parts.join(" ");
    }

    summarize(text) {
      if (this.options.summary) this.options.summary.textContent = text;
    }

    destroy() {
      if (this.plot) this.plot.destroy();
      this.plot = null;
      this.key = "";
    }
  }

  return {Chart, PALETTE, X_UNITS, X_LABELS, align, formatX, formatY, midpoints, smooth};
})();
