// The run page's live parts: its charts (the series API, refetched for a zoomed range), long polling of the run's
// updates while it is unfinished (which reloads the page's htmx partials when something changed), and the log tail.
"use strict";
(() => {
  const root = document.getElementById("run-page");
  if (!root) return;
  const api = `/api/runs/${root.dataset.run}`;
  const LABELS = {loss: "loss", val_loss: "validation loss", lr: "learning rate", tokens_per_s: "tokens/s",
                  mfu: "MFU", memory: "max allocated"};
  const REFRESH_MS = 3000;   // charts redrawn at most this often while steps arrive
  const MEASURE_MS = 30000;  // the estimate-beside-measured figures, likewise
  const state = {x: "step", log: false, smoothing: 0, range: null, answer: null,
                 status: root.dataset.status, lastStep: Number(root.dataset.lastStep) || 0,
                 lastEvent: Number(root.dataset.lastEvent) || 0, finished: root.dataset.finished === "1"};
  const $ = id => document.getElementById(id);
  const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
  const chartState = $("chart-state");

  document.addEventListener("submit", event => {
    const form = event.target;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
    if (form.id === "chart-controls" || form.id === "log-controls") event.preventDefault();
  });

  // -- charts ------------------------------------------------------------------------------------------------------

  const charts = [...root.querySelectorAll(".chart[data-names]")].map(el => ({
    names: el.dataset.names.split(","),
    labels: JSON.parse(el.dataset.labels || "{}"),  // an evaluation set's series ("eval:<id>") by the set's name
    chart: new WorkbenchCharts.Chart(el, {yUnit: el.dataset.yUnit, syncKey: `run-${root.dataset.run}`, onZoom: zoom,
                                          summary: $(el.getAttribute("aria-describedby")), empty: el.dataset.empty}),
  }));
  const names = [...new Set(charts.flatMap(c => c.names))];

  function pointsWanted() {
    const width = charts.length ? charts[0].chart.width() : 600;
    return Math.max(200, Math.min(2000, 2 * Math.round(width)));
  }

  function draw() {
    const answer = state.answer;
    if (!answer) return;
    for (const {names: shown, labels, chart} of charts) {
      // a blend source's validation loss ("val_loss:<source>") is labelled with the source's name
      const lines = shown.map(name => ({label: labels[name] || LABELS[name] || name.replace(/^val_loss:/, ""),
                                        frame: answer.frame,
                                        ...(answer.series[name] || {points: [], count: 0})}));
      chart.draw({lines, x: state.x, log: state.log, smoothing: state.smoothing});
    }
    const frame = answer.frame;
    chartState.textContent = !frame ? "No step recorded yet." : state.range ?
      `Zoomed to ${WorkbenchCharts.formatX(state.x, frame.start)} – ${WorkbenchCharts.formatX(state.x, frame.end)} ` +
      `(${WorkbenchCharts.X_LABELS[state.x]}); ${answer.block_steps > 1 ? `blocks of ${answer.block_steps} steps` : "every step"}.` :
      `Whole run; ${answer.block_steps > 1 ? `blocks of ${answer.block_steps} steps` : "every step"} read.`;
  }

  let loading = null, again = false;
  async function refresh() {
    if (loading) { again = true; return; }  // one request at a time; one more after it if asked meanwhile
    const params = new URLSearchParams({names: names.join(","), x: state.x, points: String(pointsWanted())});
    if (state.range) { params.set("start", state.range[0]); params.set("end", state.range[1]); }
    loading = Workbench.json(`${api}/series/?${params}`);
    try {
      const previous = state.answer;
      state.answer = await loading;
      rescaleSmoothing(previous, state.answer);
      draw();
    } catch (error) {
      chartState.textContent = `The charts could not be loaded: ${error.message}`;
    } finally {
      loading = null;
    }
    if (again) { again = false; refresh(); }
  }

  // A smoothing window is in the x axis' units; switching axis keeps its share of the whole run.
  let rescaleFrom = null;
  function rescaleSmoothing(previous, answer) {
    if (!rescaleFrom || !answer.frame || !(state.smoothing > 0)) { rescaleFrom = null; return; }
    const before = rescaleFrom.end - rescaleFrom.start, after = answer.frame.end - answer.frame.start;
    rescaleFrom = null;
    if (before > 0 && after > 0) {
      state.smoothing = Number((state.smoothing * after / before).toPrecision(3));
      $("chart-smoothing").value = String(state.smoothing);
    }
  }

  let refreshTimer = null;
  function refreshSoon() {
    if (refreshTimer || state.range) return;  // a zoomed view stays where the reader put it
    refreshTimer = setTimeout(() => { refreshTimer = null; refresh(); }, REFRESH_MS);
  }

  function zoom(start, end) {
    if (!(end > start)) return;
    state.range = [start, end];
    $("chart-from").value = String(Number(start.toPrecision(6)));
    $("chart-to").value = String(Number(end.toPrecision(6)));
    refresh();
  }

  $("chart-x").addEventListener("change", event => {
    rescaleFrom = state.range ? null : state.answer && state.answer.frame;
    state.x = event.target.value;
    state.range = null;
    $("chart-from").value = $("chart-to").value = "";
    for (const unit of root.querySelectorAll("[data-unit]")) unit.textContent = WorkbenchCharts.X_UNITS[state.x];
    refresh();
  });
  $("chart-log").addEventListener("change", event => { state.log = event.target.checked; draw(); });
  let smoothTimer = null;
  $("chart-smoothing").addEventListener("input", event => {
    clearTimeout(smoothTimer);
    smoothTimer = setTimeout(() => {
      const value = Number(event.target.value);
      state.smoothing = Number.isFinite(value) && value > 0 ? value : 0;
      draw();
    }, 200);
  });
  $("chart-zoom").addEventListener("click", () => {
    const start = Number($("chart-from").value), end = Number($("chart-to").value);
    if ($("chart-from").value === "" || $("chart-to").value === "" || !(end > start)) {
      chartState.textContent = "Give a From below To to zoom.";
      return;
    }
    zoom(start, end);
  });
  $("chart-reset").addEventListener("click", () => {
    state.range = null;
    $("chart-from").value = $("chart-to").value = "";
    refresh();
  });

  // -- live updates ------------------------------------------------------------------------------------------------

  let measuredAt = Date.now();
  function apply(update) {
    const statusChanged = update.status !== state.status;
    state.status = update.status;
    state.finished = update.finished;
    // The messages the last action left ("is queued", "is cancelled", a refusal) told of the status it found or
    // led to: once the status moves on they are history, which the events table keeps.
    if (statusChanged) document.querySelector("main .messages")?.parentElement.remove();
    const badge = document.querySelector('[data-testid="run-status"]');
    if (badge) { badge.textContent = update.status; badge.className = `status status-${update.status}`; }
    const newSteps = update.last_step > state.lastStep;
    if (newSteps) {
      state.lastStep = update.last_step;
      const step = document.querySelector('[data-testid="run-step"]');
      if (step) step.textContent = String(update.last_step);
    }
    if (update.events.length) state.lastEvent = update.events[update.events.length - 1].id;
    if (update.changed || statusChanged) htmx.trigger(document.body, "wb:changed");
    if (update.events.length || statusChanged) htmx.trigger(document.body, "wb:events");
    const profiled = update.events.some(e => e.kind === "profile_written");
    if (profiled || update.finished || (newSteps && Date.now() - measuredAt > MEASURE_MS)) {
      measuredAt = Date.now();
      htmx.trigger(document.body, "wb:measure");
    }
    if (newSteps) refreshSoon();
  }

  async function follow() {
    let failures = 0;
    while (!state.finished) {
      const params = new URLSearchParams({after_event: state.lastEvent, after_step: state.lastStep,
                                          status: state.status, wait: "25"});
      try {
        apply(await Workbench.json(`/api/runs/${root.dataset.run}/updates/?${params}`));
        failures = 0;
      } catch (error) {  // a restarted server or a lost connection: ask again with the same cursors
        failures += 1;
        chartState.textContent = `Live updates interrupted (${error.message}); trying again.`;
        await sleep(Math.min(30000, 2000 * failures));
      }
    }
    if (!state.range) refresh();
    followLog();
  }

  // -- logs --------------------------------------------------------------------------------------------------------

  const CHUNK = 65536, KEEP_CHARS = 1 << 20;
  const logText = $("log-text"), logState = $("log-state"), logFile = $("log-file"), logFollow = $("log-follow");
  const log = {file: null, first: 0, next: 0, size: 0};
  let logBusy = false;

  const readLog = (file, offset, limit) =>
    Workbench.json(`${api}/logs/?${new URLSearchParams({file, offset: String(offset), limit: String(limit)})}`);

  function addLogFiles(files) {
    const have = new Set([...logFile.options].map(o => o.value));
    for (const {name} of files) {
      if (!have.has(name)) logFile.add(new Option(name, name));
    }
  }

  function describeLog() {
    logState.textContent = log.file ? `${log.file}: bytes ${log.first.toLocaleString("en-US")}–` +
      `${log.next.toLocaleString("en-US")} of ${log.size.toLocaleString("en-US")}` +
      (logFollow.checked && !state.finished ? ", following" : "") : "";
  }

  async function withLog(work) {
    if (logBusy) return;
    logBusy = true;
    try { await work(); } catch (error) {
      logState.textContent = `${logFile.value}: ${error.message}`;
    } finally { logBusy = false; }
  }

  function showEnd() {
    return withLog(async () => {
      const file = logFile.value;
      if (!file) { logState.textContent = "No log file yet."; return; }
      const listed = await Workbench.json(`${api}/logs/`);
      addLogFiles(listed.files);
      const entry = listed.files.find(f => f.name === file);
      Object.assign(log, {file: null, first: 0, next: 0, size: 0});
      logText.textContent = "";
      if (!entry) { logState.textContent = `${file} has not been written yet.`; return; }
      log.file = file;
      const start = Math.max(0, entry.size - CHUNK);
      const chunk = await readLog(file, start, CHUNK);
      Object.assign(log, {first: chunk.offset, next: chunk.next_offset, size: chunk.size});
      logText.textContent = chunk.text;
      await readOn();
      logText.scrollTop = logText.scrollHeight;
      describeLog();
    });
  }

  async function readOn() {
    for (;;) {
      const chunk = await readLog(log.file, log.next, CHUNK);
      log.size = chunk.size;
      if (chunk.text) {
        const atEnd = logText.scrollTop + logText.clientHeight >= logText.scrollHeight - 4;
        let text = logText.textContent + chunk.text;
        if (text.length > KEEP_CHARS) {  // keep the page light while following a long log
          const dropped = text.slice(0, text.length - KEEP_CHARS);
          log.first += new TextEncoder().encode(dropped).length;
          text = text.slice(-KEEP_CHARS);
        }
        logText.textContent = text;
        if (atEnd) logText.scrollTop = logText.scrollHeight;
      }
      log.next = chunk.next_offset;
      if (!chunk.more) break;
    }
  }

  $("log-earlier").addEventListener("click", () => withLog(async () => {
    if (!log.file || log.first <= 0) { logState.textContent = "This is the start of the log."; return; }
    const start = Math.max(0, log.first - CHUNK);
    const chunk = await readLog(log.file, start, log.first - start);
    const height = logText.scrollHeight;
    logText.textContent = chunk.text + logText.textContent;
    logText.scrollTop += logText.scrollHeight - height;
    log.first = start;
    describeLog();
  }));
  $("log-load").addEventListener("click", showEnd);
  logFile.addEventListener("change", showEnd);
  logFollow.addEventListener("change", () => { describeLog(); if (logFollow.checked) followLog(); });

  // Following reads on from where the text ends; a file not written yet is looked for in the listing (a read of
  // it would be a 404) until it appears.
  let logTimer = null;
  function followLog() {
    clearTimeout(logTimer);
    if (!logFollow.checked) return;
    const tick = log.file ? withLog(async () => { await readOn(); describeLog(); }) : showEnd();
    tick.then(() => {
      if (!state.finished) logTimer = setTimeout(followLog, document.visibilityState === "visible" ? 2000 : 10000);
    });
  }

  // -- start -------------------------------------------------------------------------------------------------------

  refresh();
  showEnd().then(followLog);
  if (!state.finished) follow();
})();
