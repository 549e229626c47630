// The compare page's chart: one series of every chosen run from /api/runs/compare/ (binned over one range, so the
// runs' bins share their edges), aligned by step, tokens or wall time; a dragged range is fetched in finer detail.
"use strict";
(() => {
  const root = document.getElementById("compare-page");
  if (!root) return;
  const $ = id => document.getElementById(id);
  const el = root.querySelector('[data-testid="compare-chart"]');
  const stateLine = $("compare-state");
  const seriesSelect = $("compare-series"), xSelect = $("compare-x");
  const state = {ids: root.dataset.ids, name: root.dataset.seriesName, x: root.dataset.x, log: false, smoothing: 0,
                 range: null, answer: null};
  const Y_UNITS = {mfu: "fraction", memory: "bytes", tokens_per_s: "tokens/s"};
  const chart = new WorkbenchCharts.Chart(el, {yUnit: Y_UNITS[state.name] || "", summary: $("compare-summary"),
                                               onZoom: (start, end) => { state.range = [start, end]; load(); }});

  function draw() {
    const answer = state.answer;
    if (!answer) return;
    const lines = answer.runs.map(run => ({label: `${run.name} #${run.id}`, frame: run.frame,
                                           ...(run.series[state.name] || {points: [], count: 0})}));
    chart.draw({lines, x: state.x, log: state.log, smoothing: state.smoothing});
    const label = seriesSelect.selectedOptions[0].textContent;
    $("compare-caption").textContent = `${label} of ${lines.length} run${lines.length === 1 ? "" : "s"} by ` +
      `${WorkbenchCharts.X_LABELS[state.x]}`;
    el.setAttribute("aria-label", `${label} of the compared runs against ${WorkbenchCharts.X_LABELS[state.x]}`);
    const frame = answer.frame;
    stateLine.textContent = `${state.range ? "Zoomed to" : "Whole range:"} ${WorkbenchCharts.formatX(state.x, frame.start)} – ` +
      `${WorkbenchCharts.formatX(state.x, frame.end)}, ${frame.bins} bins.`;
  }

  let loading = false;
  async function load() {
    if (loading) return;
    loading = true;
    const params = new URLSearchParams({ids: state.ids, names: state.name, x: state.x,
                                        points: String(Math.max(200, Math.min(2000, 2 * chart.width())))});
    if (state.range) { params.set("start", state.range[0]); params.set("end", state.range[1]); }
    try {
      state.answer = await Workbench.json(`/api/runs/compare/?${params}`);
      draw();
    } catch (error) {
      stateLine.textContent = `The runs could not be loaded: ${error.message}`;
    } finally {
      loading = false;
    }
  }

  // The chosen series and axis go in the address, so a comparison can be shared as a link.
  function remember() {
    const url = new URL(window.location.href);
    url.searchParams.set("series", state.name);
    url.searchParams.set("x", state.x);
    history.replaceState(null, "", url);
  }

  seriesSelect.addEventListener("change", () => {
    state.name = seriesSelect.value;
    state.range = null;
    chart.options.yUnit = Y_UNITS[state.name] || "";
    remember();
    load();
  });
  xSelect.addEventListener("change", () => {
    state.x = xSelect.value;
    state.range = null;
    for (const unit of document.querySelectorAll("[data-unit]")) unit.textContent = WorkbenchCharts.X_UNITS[state.x];
    remember();
    load();
  });
  $("compare-log").addEventListener("change", event => { state.log = event.target.checked; draw(); });
  $("compare-smoothing").addEventListener("input", event => {
    const value = Number(event.target.value);
    state.smoothing = Number.isFinite(value) && value > 0 ? value : 0;
    draw();
  });
  $("compare-reset").addEventListener("click", () => { state.range = null; load(); });

  for (const unit of document.querySelectorAll("[data-unit]")) unit.textContent = WorkbenchCharts.X_UNITS[state.x];
  load();
})();
