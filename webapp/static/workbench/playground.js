// The prompt playground: the server checks the form and writes the prompt out (prepare), then each chosen deployment
// streams its answer from the generate endpoint into its panel while the page measures it (time to first token,
// tokens/s); what came back is posted to the history. Presets, saved versions and history rows fill the form.
"use strict";

// Model text as the playground shows it: what a reader could not see is shown by a sign. A line break gets ↵, a tab
// ⇥, another control character its code (⟨0x0B⟩) and an invisible format character its code point (⟨U+200B⟩), each
// drawn by CSS before the character, which stays in the text as it came, so that copying takes the text unchanged;
// U+FFFD, what the server's tokenizer writes for bytes that are not UTF-8, is marked where it stands.
const Playground = (() => {
  const UNSEEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\ufffd]/gu;  // controls, format characters, line and paragraph separators
  const WHITESPACE = {"\n": ["↵", "line break"], "\t": ["⇥", "tab"]};

  function marker(ch) {
    const code = ch.codePointAt(0), hex = code.toString(16).toUpperCase();
    const span = document.createElement("span");
    span.textContent = ch;
    if (ch === "\ufffd") {
      span.className = "undecodable";
      span.title = "bytes that are not UTF-8 text (U+FFFD)";
      return span;
    }
    const control = code < 0x20 || (code >= 0x7f && code < 0xa0);
    const [sign, name] = WHITESPACE[ch] || (control ? [`⟨0x${hex.padStart(2, "0")}⟩`, "control character"]
      : [`⟨U+${hex.padStart(4, "0")}⟩`, "invisible character"]);
    span.className = WHITESPACE[ch] ? "unseen" : "unseen coded";
    span.dataset.sign = sign;
    span.title = `${name} U+${hex.padStart(4, "0")}`;
    return span;
  }

  // ``text`` as nodes to append: plain runs as text, each unseen character in its marked span
  function visible(text) {
    const nodes = document.createDocumentFragment();
    let at = 0;
    for (const match of text.matchAll(UNSEEN)) {
      if (match.index > at) nodes.append(text.slice(at, match.index));
      nodes.append(marker(match[0]));
      at = match.index + match[0].length;
    }
    if (at < text.length) nodes.append(text.slice(at));
    return nodes;
  }

  // the server-rendered answers (history, prompt sets), as each arrives
  function markAnswers(root) {
    for (const el of root.querySelectorAll("[data-visible-text]:not([data-marked])")) {
      el.replaceChildren(visible(el.textContent));
      el.dataset.marked = "";
    }
  }
  document.addEventListener("htmx:load", (event) => markAnswers(event.detail.elt));
  document.addEventListener("DOMContentLoaded", () => markAnswers(document));

  return {visible};
})();

(() => {
  const form = document.getElementById("playground");
  if (!form) return;
  const $ = (selector, root = document) => root.querySelector(selector);
  const generate = $("#generate"), stopButton = $("#stop-generation"), compare = $("#compare");
  // no tokens/s from fewer tokens or a shorter span than these (webapp.services.playground says why)
  const MIN_RATE_TOKENS = Number(form.dataset.minRateTokens), MIN_RATE_MS = Number(form.dataset.minRateMs);
  const SENT = ["deployment", "compare", "template", "examples", "input", "temperature", "top_k", "top_p",
                "max_tokens", "seed", "stop"];
  let running = null;  // the AbortController of the generation under way

  const panel = (n) => $(`#panel-${n}`);
  const part = (n, name) => $(`[data-testid="${name}-${n}"]`);

  function showComparePanel() {
    panel(2).hidden = !compare.value;
  }
  compare.addEventListener("change", showComparePanel);

  // -- errors beside the fields ---------------------------------------------------------------------------------
  function clearErrors() {
    for (const el of form.querySelectorAll("[data-error-for]")) {
      el.textContent = "";
      el.hidden = true;
      const field = form.elements[el.dataset.errorFor];
      if (field && field.removeAttribute) field.removeAttribute("aria-invalid");
    }
  }

  function showErrors(errors) {
    let first = null;
    for (const [name, messages] of Object.entries(errors)) {
      const el = form.querySelector(`[data-error-for="${CSS.escape(name)}"]`) || $("#form-error");
      el.textContent = (el.textContent ? el.textContent + " " : "") + messages.join(" ");
      el.hidden = false;
      const field = form.elements[name];
      if (field && field.setAttribute) {
        field.setAttribute("aria-invalid", "true");
        first = first || field;
      }
    }
    (first || $("#form-error")).focus();
  }

  // -- filling the form -----------------------------------------------------------------------------------------
  function fill(values) {
    if ("template" in values) form.elements.template.value = values.template;
    if ("examples" in values) form.elements.examples.value = JSON.stringify(values.examples || [], null, 1);
    if ("input" in values) form.elements.input.value = values.input;
    for (const [name, value] of Object.entries(values.sampling || {})) {
      if (form.elements[name]) form.elements[name].value = value === null || value === undefined ? "" : value;
    }
    if ("stop" in values) form.elements.stop.value = values.stop;
  }

  const data = (id) => JSON.parse(document.getElementById(id).textContent);

  $("#use-preset").addEventListener("click", () => {
    const preset = data("presets-data")[form.elements.preset.value];
    if (preset) fill({template: preset.template, examples: preset.examples});
  });

  document.addEventListener("click", (e) => {
    const button = e.target.closest("#load-version");
    if (!button) return;
    const chosen = Number($("#version").value);
    const version = data("versions-data").find((v) => v.id === chosen);
    if (!version) return;
    fill(version);
    form.elements.template_name.value = version.name;
  });

  document.addEventListener("click", (e) => {
    const button = e.target.closest("[data-replay]");
    if (!button) return;
    const record = JSON.parse(button.dataset.replay);
    const select = form.elements.deployment;
    clearErrors();
    if (![...select.options].some((o) => o.value === String(record.deployment))) {
      showErrors({deployment: ["the deployment that answered this is no longer ready: choose another, then Generate"]});
      fill(record);
      return;
    }
    select.value = String(record.deployment);
    compare.value = "";
    showComparePanel();
    fill(record);
    form.requestSubmit(generate);
  });

  // -- generation -----------------------------------------------------------------------------------------------
  function formBody() {
    const body = {};
    for (const name of SENT) body[name] = form.elements[name].value;
    return body;
  }

  function reset(n, model) {
    $("[data-model]", panel(n)).textContent = model;
    part(n, "output").textContent = "";
    part(n, "counts").textContent = "prompt … tokens · completion 0 tokens";
    part(n, "ttft").textContent = "time to first token …";
    part(n, "tps").textContent = "… tokens/s";
    part(n, "finish").textContent = "";
    part(n, "error").hidden = true;
    part(n, "error").textContent = "";
  }

  function ms(value) {
    return value === null ? "–" : `${Workbench.number(value, 3)} ms`;
  }

  // Errors answered before the stream starts come as text ("503: event: error\ndata: {...}"): the detail alone.
  function detail(error) {
    const text = String(error.message || error);
    const match = text.match(/data:\s*(\{.*\})/s);
    if (match) {
      try { return `${text.split(":")[0]}: ${JSON.parse(match[1]).detail}`; } catch (e) { /* as it is */ }
    }
    return text;
  }

  async function streamOne(n, deployment, prepared, signal) {
    reset(n, `${deployment.model_name} #${deployment.id}`);
    const out = part(n, "output");
    const started = performance.now();
    let first = null, last = null, completion = 0, done = null, error = "";
    try {
      await Workbench.streamEvents(deployment.url, {...prepared.params, prompt: prepared.prompt, stream: true},
        (name, event) => {
          const now = performance.now();
          if (name === "token") {
            if (first === null) {
              first = now;
              part(n, "ttft").textContent = `time to first token ${ms(first - started)}`;
            }
            last = now;
            completion += event.token_ids.length;
            out.append(Playground.visible(event.text));
            part(n, "counts").textContent = `prompt … tokens · completion ${completion} tokens`;
          } else if (name === "done") {
            done = event;
          } else if (name === "error") {
            error = event.detail;
          }
        }, signal);
    } catch (e) {
      error = signal.aborted ? "stopped before the end" : detail(e);
    }
    const ended = performance.now();
    const tokens = done ? done.completion_tokens : completion;
    // the decode rate, tokens after the first over the time after the first, once there are enough to time
    const untimed = tokens < MIN_RATE_TOKENS ? `fewer than ${MIN_RATE_TOKENS} tokens`
      : !(last - first >= MIN_RATE_MS) ? `arrived within ${MIN_RATE_MS} ms` : "";
    const rate = untimed ? null : (tokens - 1) / ((last - first) / 1000);
    part(n, "counts").textContent =
      `prompt ${done ? done.prompt_tokens : "–"} tokens · completion ${tokens} tokens`;
    part(n, "ttft").textContent = `time to first token ${ms(first === null ? null : first - started)}`;
    part(n, "tps").textContent = untimed ? `– tokens/s (${untimed})` : `${Workbench.number(rate, 3)} tokens/s`;
    part(n, "finish").textContent = done ? `· ended: ${done.finish_reason}` : "";
    if (error) {
      part(n, "error").textContent = error;
      part(n, "error").hidden = false;
    }
    const record = {
      deployment: deployment.id, input: prepared.input, template: prepared.template, examples: prepared.examples,
      prompt: prepared.prompt, sampling: prepared.sampling, output: done ? done.text : out.textContent, error,
      finish_reason: done ? done.finish_reason : (signal.aborted ? "cancelled" : ""),
      prompt_tokens: done ? done.prompt_tokens : null, completion_tokens: tokens,
      ttft_ms: first === null ? null : first - started, tokens_per_s: rate, total_ms: ended - started};
    try {
      await Workbench.json(form.dataset.recordUrl, {method: "POST", body: JSON.stringify(record)});
    } catch (e) {
      part(n, "error").textContent = `${error ? error + "; " : ""}not kept in the history: ${e.message}`;
      part(n, "error").hidden = false;
    }
  }

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (running) return;
    clearErrors();
    let prepared;
    try {
      prepared = await Workbench.json(form.dataset.prepareUrl, {method: "POST", body: JSON.stringify(formBody())});
    } catch (err) {
      showErrors({__all__: [err.message]});
      return;
    }
    if (prepared.errors) {
      showErrors(prepared.errors);
      return;
    }
    running = new AbortController();
    generate.disabled = true;
    stopButton.disabled = false;
    panel(2).hidden = prepared.deployments.length < 2;
    try {
      await Promise.all(prepared.deployments.map((d, i) => streamOne(i + 1, d, prepared, running.signal)));
    } finally {
      running = null;
      generate.disabled = false;
      stopButton.disabled = true;
      document.body.dispatchEvent(new CustomEvent("history-changed"));
    }
  });

  // the output as it came, signs left out (they are drawn by CSS, not in the text); where the page may not write the
  // clipboard (plain HTTP away from localhost) the text is selected for the reader's own copy
  document.addEventListener("click", async (e) => {
    const button = e.target.closest("[data-copy]");
    if (!button) return;
    const out = part(button.dataset.copy, "output"), label = button.firstChild;
    try {
      await navigator.clipboard.writeText(out.textContent);
      label.textContent = "Copied";
    } catch (err) {
      getSelection().selectAllChildren(out);
      label.textContent = "Selected: copy it";
    }
    setTimeout(() => { label.textContent = "Copy text"; }, 2000);
  });

  stopButton.addEventListener("click", () => running && running.abort());
  showComparePanel();
})();
