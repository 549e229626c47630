"""The whole path in the browser, on the real parts: two tiny runs made in the wizard, trained by the session's
Celery worker with torchrun, watched to the end on their pages, compared, deployed on the session's Triton from
the deploy page, and asked the same prompt side by side in the playground, the text streaming in."""
import re
import threading
import unicodedata
from contextlib import contextmanager

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import check_page
from webapp import models

RUN_SECONDS = 240_000     # ms: a run queued behind another, trained, reconciled
DEPLOY_SECONDS = 240_000  # ms: exported, loaded into Triton, smoke-checked


@contextmanager
def reconciling(broker, every: float = 1.0):
    """Reconcile passes for as long as the block lasts, as the worker's beat sends them in the product."""
    stop = threading.Event()

    def passes():
        while not stop.is_set():
            broker.send_task("workbench.runs.reconcile").get(timeout=120)
            stop.wait(every)

    thread = threading.Thread(target=passes, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=130)


def launch_from_the_wizard(page, name: str, tp: int) -> int:
    page.goto("/runs/new/")
    page.get_by_label("Run name").fill(name)
    page.get_by_label("tp", exact=True).fill(str(tp))
    page.get_by_label("tp", exact=True).dispatch_event("change")
    expect(page.get_by_label("dp", exact=True)).to_have_value(str(2 // tp))
    page.get_by_test_id("launch").click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def deploy_from_the_deploy_page(page, checkpoint: models.Checkpoint, reduction: str) -> models.Deployment:
    page.goto(f"/deploy/?checkpoint={checkpoint.pk}")
    page.get_by_label("Reduction").select_option(reduction)
    page.get_by_label("Triton server").select_option(str(models.TritonServer.objects.get(name="local").pk))
    before = set(models.Deployment.objects.values_list("pk", flat=True))
    page.get_by_role("button", name="Deploy").click()
    expect(page.locator("[data-testid^=deployment-status-]")).to_have_count(len(before) + 1)
    return models.Deployment.objects.exclude(pk__in=before).get()


@pytest.mark.slow
@pytest.mark.once  # a worker, torchrun and the real Triton: once, on the first database
def test_it_takes_two_runs_from_the_wizard_through_their_pages_and_deployment_to_the_playground(
        signed_in_page, broker, triton, settings, tmp_path):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs"}
    models.TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                       metrics_url=triton.metrics_url, model_repository=str(triton.repository))
    page = signed_in_page

    # the wizard: the estimate follows tp as it changes
    page.goto("/")
    page.locator("main").get_by_role("link", name="New run").first.click()
    step_time = page.get_by_test_id("estimate-step-time")
    expect(step_time).not_to_be_empty()
    before = step_time.inner_text()
    page.get_by_label("tp", exact=True).fill("2")
    page.get_by_label("tp", exact=True).dispatch_event("change")
    expect(step_time).not_to_have_text(before)
    check_page(page, "first-wizard-tp2")

    first = launch_from_the_wizard(page, "first", tp=1)
    second = launch_from_the_wizard(page, "second", tp=2)
    with reconciling(broker):
        for run_id, name in ((first, "first"), (second, "second")):
            page.goto(f"/runs/{run_id}/")
            expect(page.get_by_test_id("run-status")).to_have_text("completed", timeout=RUN_SECONDS)
            expect(page.get_by_test_id("chart-loss")).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"))
            digest = page.get_by_test_id("profile-digest")
            expect(digest).to_contain_text("compute", timeout=30_000)
            check_page(page, f"first-run-{name}")

    # the compare page: both runs overlaid, tp among what differs
    page.goto(f"/compare/?ids={first},{second}")
    expect(page.get_by_test_id("compare-chart")).to_have_attribute("data-series", "2")
    expect(page.get_by_role("table").filter(has_text="plan.tp")).to_be_visible()
    check_page(page, "first-compare")

    # deploy each run's final checkpoint, the second reduced to int8
    deployments = [deploy_from_the_deploy_page(page, models.Checkpoint.objects.filter(run_id=run_id).latest("step"),
                                               reduction)
                   for run_id, reduction in ((first, "none"), (second, "int8"))]
    with reconciling(broker, every=5.0):
        for deployment in deployments:
            expect(page.get_by_test_id(f"deployment-status-{deployment.pk}")).to_have_text(
                "ready", timeout=DEPLOY_SECONDS)
            expect(page.get_by_test_id(f"deployment-smoke-{deployment.pk}")).to_have_text("passed")
    expect(page.get_by_label(f"lineage of {deployments[0].model_name}")).to_contain_text("first")
    check_page(page, "first-deploy")

    # the playground: the two models side by side, streamed, with their counts and timings
    page.goto("/playground/")
    page.get_by_label("Deployment").select_option(str(deployments[0].pk))
    page.get_by_label("Compare with").select_option(str(deployments[1].pk))
    page.get_by_label("Input").fill("ROMEO:")
    page.get_by_label("Max tokens").fill("48")  # within the models' context of 64 tokens, with the prompt
    _generate_and_watch(page)
    check_page(page, "first-playground", phone=True)


# Holds the end of each event stream the page reads (every byte passes, only the close waits) until the test
# releases it: a page that shows text before then renders events as they arrive, one that reads the body whole shows
# nothing. Waiting on that event, not on how the bytes happened to be split into reads, keeps the check exact.
HOLD_STREAM_ENDS = """() => {
  window.heldStreams = [];
  const fetchPage = window.fetch;
  window.fetch = async (...args) => {
    const response = await fetchPage(...args);
    if (!(response.headers.get("Content-Type") || "").includes("event-stream")) return response;
    const reader = response.body.getReader();
    let release;
    const released = new Promise(resolve => { release = resolve; });
    window.heldStreams.push(release);
    const body = new ReadableStream({async pull(controller) {
      const {value, done} = await reader.read();
      if (!done) { controller.enqueue(value); return; }
      await released;
      controller.close();
    }});
    return new Response(body, {status: response.status, headers: response.headers});
  };
}"""


def _generate_and_watch(page) -> None:
    """Generate with the streams' ends held: each output shows text while its stream is open, written token by
    token; released, each ends with its counts and timings."""
    page.evaluate(HOLD_STREAM_ENDS)
    page.evaluate("""() => { window.records = {1: 0, 2: 0};
        [1, 2].forEach(n => {
          const out = document.querySelector(`[data-testid=output-${n}]`);
          new MutationObserver(records => {
            window.records[n] += records.filter(r => r.addedNodes.length || r.type === "characterData").length; })
            .observe(out, {childList: true, characterData: true, subtree: true});
        }); }""")
    page.get_by_role("button", name="Generate").click()
    # text (often line breaks only, which Playwright's emptiness ignores) in both outputs
    page.wait_for_function("() => [1, 2].every(n => document.querySelector(`[data-testid=output-${n}]`)"
                           ".textContent.length > 0)", timeout=60_000)
    assert page.evaluate("() => window.heldStreams.length") == 2
    for n in (1, 2):   # still open: the page has not seen either stream end
        expect(page.get_by_test_id(f"finish-{n}")).to_have_text("")
    page.evaluate("() => window.heldStreams.forEach(release => release())")
    for n in (1, 2):
        expect(page.get_by_test_id(f"finish-{n}")).to_contain_text("ended", timeout=60_000)
        expect(page.get_by_test_id(f"counts-{n}")).to_have_text(re.compile(r"prompt \d+ tokens · completion \d+ tokens"))
        expect(page.get_by_test_id(f"ttft-{n}")).to_have_text(re.compile(r"time to first token [\d.,]+ ms"))
        # a model of 30 tiny steps mostly answers line breaks: its text is there, each line break shown by its sign
        # (and any other character a reader could not see), not as an empty box
        output = page.get_by_test_id(f"output-{n}")
        text = output.text_content()
        assert text.strip(" ")
        expect(output.locator(".unseen")).to_have_count(
            sum(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text))
        expect(output.locator(".undecodable")).to_have_count(text.count("\ufffd"))
    records = page.evaluate("() => window.records")
    assert all(count > 1 for count in records.values()), f"an output was written at once, not token by token: {records}"
