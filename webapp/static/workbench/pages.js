// Shared by the pages: CSRF for fetch, number formats, and a reader of server-sent events over fetch (POST bodies,
// which EventSource cannot send). Page-specific code lives in its own file beside this one.
"use strict";
const Workbench = (() => {
  const csrf = () => document.querySelector('meta[name="csrf-token"]').content;

  async function json(url, options = {}) {
    const response = await fetch(url, {credentials: "same-origin", ...options,
      headers: {"Accept": "application/json", "X-CSRFToken": csrf(), ...(options.body ? {"Content-Type": "application/json"} : {}),
                ...(options.headers || {})}});
    const body = response.headers.get("Content-Type")?.includes("json") ? await response.json() : await response.text();
    if (!response.ok) {
      throw new Error(typeof body === "string" ? body : (body.detail || said(body.errors) || JSON.stringify(body)));
    }
    return body;
  }

  // A form's refusal, {"errors": {field: [messages]}}, as a sentence: "field: message; …".
  function said(errors) {
    if (!errors || typeof errors !== "object") return "";
    return Object.entries(errors).map(([field, messages]) =>
      `${field === "__all__" ? "" : `${field}: `}${[].concat(messages).join(" ")}`).join("; ");
  }

  // POST ``body`` to ``url`` and call ``onEvent(name, data)`` for each server-sent event as it arrives.
  async function streamEvents(url, body, onEvent, signal) {
    const response = await fetch(url, {method: "POST", credentials: "same-origin", signal,
      headers: {"Accept": "text/event-stream", "Content-Type": "application/json", "X-CSRFToken": csrf()},
      body: JSON.stringify(body)});
    if (!response.ok) {
      const text = await response.text();
      let detail = text;
      try { detail = JSON.parse(text).detail || text; } catch (e) { /* not JSON: the text as it is */ }
      throw new Error(`${response.status}: ${detail}`);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trim();
        }
        if (data) onEvent(name, JSON.parse(data));
      }
    }
  }

  function number(value, digits = 3) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    const size = Math.abs(value);
    if (size !== 0 && (size >= 1e6 || size < 1e-3)) return value.toExponential(digits - 1);
    return Number(value.toPrecision(digits)).toLocaleString("en-US");
  }

  return {csrf, json, streamEvents, number};
})();

// A form that leaves the page waits for the page's htmx requests in flight (an estimate being fetched, a list
// being refreshed), up to MAX_WAIT_MS, and no new one starts once it goes (a field's delayed trigger): leaving
// would abort them, which htmx reports as errors, for nothing.
(() => {
  const MAX_WAIT_MS = 3000;
  let leaving = false, inFlight = 0;
  const busy = () => inFlight > 0;
  document.addEventListener("htmx:beforeRequest", event => { if (leaving) event.preventDefault(); });
  document.addEventListener("htmx:beforeSend", () => { inFlight += 1; });
  document.addEventListener("htmx:afterRequest", () => { inFlight = Math.max(0, inFlight - 1); });
  window.addEventListener("pageshow", () => { leaving = false; });  // back again, from the browser's cache
  document.addEventListener("submit", event => {
    const form = event.target;
    if (event.defaultPrevented || leaving) return;
    event.preventDefault();
    const submitter = event.submitter;
    const started = performance.now();
    const leave = () => {
      if (busy() && performance.now() - started < MAX_WAIT_MS) return setTimeout(leave, 50);
      leaving = true;
      form.requestSubmit(submitter);
      setTimeout(() => { leaving = false; }, 5000);  // still here (a download, a refused submit): live again
    };
    setTimeout(leave);  // not from inside this submit event: a form ignores requestSubmit while it fires one
  });
})();
