// The New-run wizard's conveniences; the page works without them (the estimate then waits for Launch):
// dp follows tp, pp and cp so that dp × cp × tp × pp fills the chosen cluster, choosing a preset or a model config fills
// the model's fields with its figures, "Use this plan" fills the plan's fields with a tuned plan, Enter in a field
// re-estimates rather than launches, and an input whose error list (sent back with each estimate) is not empty is
// marked invalid.
"use strict";
(() => {
  const form = document.getElementById("wizard");
  if (!form) return;
  const input = (name) => form.elements.namedItem(name);

  function set(name, value) {
    const element = input(name);
    if (!element) return;
    if (element.type === "checkbox") element.checked = Boolean(value);
    else if (Array.isArray(value)) element.value = value.join(", ");
    else element.value = String(value);
  }

  function fillCluster() {
    const option = input("run-cluster")?.selectedOptions[0];
    const world = Number(option?.dataset.world || 0);
    const shares = ["plan-tp", "plan-pp", "plan-cp"].map((name) => Number(input(name)?.value ?? 1));
    const others = shares.reduce((a, b) => a * b, 1);
    if (world > 0 && shares.every((n) => n > 0 && Number.isInteger(n)) && world % others === 0) {
      set("plan-dp", world / others);
    }
  }

  function fillModel() {
    const option = input("model-source")?.selectedOptions[0];
    if (!option?.dataset.spec) return;
    for (const [key, value] of Object.entries(JSON.parse(option.dataset.spec))) set(`model-${key}`, value);
  }

  // Capture: these run before htmx (listening on the form, bubbling) sends the fields for an estimate.
  const SHARES = ["plan-tp", "plan-pp", "plan-cp"];
  form.addEventListener("input", (event) => {
    if (SHARES.includes(event.target.name)) fillCluster();
  }, true);
  form.addEventListener("change", (event) => {
    const name = event.target.name;
    if (SHARES.includes(name) || name === "run-cluster") fillCluster();
    if (name === "model-source") fillModel();
  }, true);

  // Enter in a field asks for an estimate instead of launching: a run is started by its button only.
  form.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.target.tagName !== "INPUT") return;
    event.preventDefault();
    event.target.dispatchEvent(new Event("change", {bubbles: true}));
  });

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-plan]");
    if (!button) return;
    for (const [key, value] of Object.entries(JSON.parse(button.dataset.plan))) set(`plan-${key}`, value);
    const status = document.getElementById("plan-used");
    if (status) status.textContent = `The plan fields now hold ${button.dataset.planLabel || "the chosen plan"}.`;
    form.dispatchEvent(new Event("change", {bubbles: true}));
    document.getElementById("plan-fields")?.scrollIntoView({block: "start"});
  });

  function markInvalid() {
    for (const list of document.querySelectorAll("ul.errorlist[data-errors-for]")) {
      const element = document.getElementById(list.dataset.errorsFor);
      if (!element) continue;
      if (list.children.length) element.setAttribute("aria-invalid", "true");
      else element.removeAttribute("aria-invalid");
    }
  }
  document.body.addEventListener("htmx:afterSettle", markInvalid);
})();
