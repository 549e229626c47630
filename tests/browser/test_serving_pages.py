"""The Deploy page and the prompt playground in the browser: both held to check_page on a laptop and a phone; a
deployment refused beside its field then made, and unloaded only once confirmed; the playground's presets, saved
versions, an answer the server could not give, the history and its replay, a prompt set, and signs for the characters
a reader could not see; and, with the session's real Triton, an answer streamed into the page with its counts and
times, copied as it came, and no tokens/s made of too few tokens."""
import re
import unicodedata

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from tests.browser.conftest import check_page
from tests.browser.wrapping import broken_words
from tests.webapp import serving
from webapp import models

# What Chromium logs for a fetch answered with an error status: the pages below ask for some on purpose
# (an unreachable model server answers 503) and show the answer themselves.
FAILED_LOAD = re.compile(r"Failed to load resource: the server responded with a status of 503")


@pytest.fixture
def parts(signed_in_page, tmp_path, settings):
    """The signed-in user's imported checkpoint of serving.SMALL_MODEL and a Triton server nothing answers on."""
    root = tmp_path / "data"
    root.mkdir()
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": [root]}
    # a context of 1,024 tokens: the few-shot preset's prompt is more than the small model's 64
    checkpoint = serving.imported(signed_in_page.user, serving.checkpoint_folder(
        root / "small", model=serving.SMALL_MODEL.replace(seq_len=1024)))
    with serving.refusing_port() as port:
        server = models.TritonServer.objects.create(name="nowhere", http_url=f"http://127.0.0.1:{port}",
                                                    grpc_url="", model_repository=str(tmp_path / "models"))
        yield checkpoint, server


def _expected_failures(page):
    page.problems.messages[:] = [m for m in page.problems.messages if not FAILED_LOAD.search(m)]


def test_the_deploy_page_offers_vllm_only_for_a_checkpoint_it_can_serve(signed_in_page, parts, sent, tmp_path):
    """Choosing a checkpoint swaps the engine field: vLLM disabled with the reason for a head size its CPU attention
    has no kernel for, offered for one it has; a deployment made on vLLM lists its engine."""
    page = signed_in_page
    checkpoint, server = parts
    head16 = serving.imported(page.user, serving.checkpoint_folder(
        tmp_path / "data" / "head16", model=serving.SMALL_MODEL.replace(name="head16", n_heads=8)))
    page.goto(f"/deploy/?checkpoint={checkpoint.pk}")
    engine = page.get_by_label("Engine")
    expect(engine.locator('option[value="vllm"]')).to_be_enabled()
    page.get_by_label("Checkpoint", exact=True).select_option(str(head16.pk))
    expect(page.get_by_label("Model name")).to_have_value("head16-step-7")
    expect(engine.locator('option[value="vllm"]')).to_be_disabled()
    expect(engine).to_have_value("workbench")
    expect(page.get_by_test_id("engine-hint")).to_contain_text("vllm cannot: head_dim 16")
    check_page(page, "deploy-engines", phone=True)
    page.get_by_label("Checkpoint", exact=True).select_option(str(checkpoint.pk))
    expect(engine.locator('option[value="vllm"]')).to_be_enabled()
    engine.select_option("vllm")
    page.get_by_role("button", name="Deploy").click()
    expect(page.get_by_text("small-step-7) is queued")).to_be_visible()
    deployment = models.Deployment.objects.get()
    assert deployment.engine == "vllm" and sent == [("workbench.deployments.deploy", deployment.pk)]
    expect(page.get_by_test_id(f"deployment-engine-{deployment.pk}")).to_have_text("vllm")


def test_the_deploy_page_refuses_beside_the_field_then_deploys_and_shows_the_status(signed_in_page, parts, sent):
    page = signed_in_page
    checkpoint, server = parts
    page.goto(f"/deploy/?checkpoint={checkpoint.pk}")
    expect(page.get_by_label("Model name")).to_have_value("small-step-7")
    check_page(page, "deploy-empty", phone=True)
    page.get_by_label("Reduction").select_option("int8")
    page.get_by_label("Tensor parallel").fill("3")
    page.get_by_role("button", name="Deploy").click()
    expect(page.get_by_text("must divide the model's n_heads=4")).to_be_visible()
    expect(page.get_by_label("Tensor parallel")).to_have_attribute("aria-invalid", "true")
    check_page(page, "deploy-refused")
    page.get_by_label("Tensor parallel").fill("2")
    page.get_by_role("button", name="Deploy").click()
    expect(page.get_by_text("small-step-7) is queued")).to_be_visible()
    deployment = models.Deployment.objects.get()
    status = page.get_by_test_id(f"deployment-status-{deployment.pk}")
    expect(status).to_have_text("pending")
    # the same again, refused: the name is held; the Deploy button is still the only one named so
    page.get_by_role("button", name="Deploy").click()
    expect(page.get_by_text("already serves a model named 'small-step-7'")).to_be_visible()
    assert sent == [("workbench.deployments.deploy", deployment.pk)]
    models.Deployment.objects.filter(pk=deployment.pk).update(status="ready", smoke_ok=True)
    expect(status).to_have_text("ready", timeout=10_000)  # the list polls while one is on its way
    expect(page.get_by_test_id(f"deployment-smoke-{deployment.pk}")).to_have_text("passed")
    check_page(page, "deploy-list", phone=True)
    # Unload asks first: answered No, the model stays; answered Yes, a worker unloads it
    unload, asked = page.get_by_role("button", name="Unload small-step-7"), []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    unload.click()
    assert asked == ["Unload small-step-7 from nowhere? It stops answering requests until it is deployed again."]
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    unload.click()
    expect(page.get_by_text("Undeploying small-step-7")).to_be_visible()
    assert len(asked) == 2 and sent[-1] == ("workbench.deployments.undeploy", deployment.pk)
    assert [task for task, _ in sent].count("workbench.deployments.undeploy") == 1  # not when answered No


def test_the_playground_fills_saves_answers_keeps_and_replays(signed_in_page, parts):
    page = signed_in_page
    checkpoint, server = parts
    deployment = serving.deployment(page.user, checkpoint, server, model_name="unreachable")
    page.goto("/playground/")
    check_page(page, "playground-empty", phone=True)

    page.get_by_label("Preset").select_option("few-shot")
    page.get_by_role("button", name="Use preset").click()
    expect(page.get_by_label("Template", exact=True)).to_have_value("{examples}Q: {input}\nA:")
    page.get_by_label("Template name").fill("qa")
    page.get_by_role("button", name="Save template").click()
    expect(page.get_by_text("Saved qa as version 1.")).to_be_visible()
    page.get_by_label("Max tokens").fill("12")
    page.get_by_role("button", name="Save template").click()
    expect(page.get_by_text("Saved qa as version 2.")).to_be_visible()
    expect(page.get_by_label("Saved template").locator("option")).to_have_count(2)

    page.get_by_label("Top-p").fill("0")
    page.get_by_label("Input").fill("Who wrote Macbeth?")
    page.get_by_role("button", name="Generate").click()
    expect(page.locator("#top_p-error")).to_contain_text("(0, 1]")
    expect(page.get_by_label("Top-p")).to_be_focused()
    page.get_by_label("Top-p").fill("1")
    page.get_by_role("button", name="Generate").click()
    expect(page.get_by_test_id("error-1")).to_contain_text("cannot be reached")
    row = page.get_by_test_id(re.compile(r"history-\d+"))
    expect(row).to_contain_text("Who wrote Macbeth?")
    _expected_failures(page)
    check_page(page, "playground-answered", phone=True)

    page.get_by_label("Input").fill("")
    row.get_by_role("button", name=re.compile("Replay")).click()
    expect(page.get_by_label("Input")).to_have_value("Who wrote Macbeth?")
    expect(page.get_by_test_id(re.compile(r"history-\d+"))).to_have_count(2)
    assert models.PlaygroundRecord.objects.filter(owner=page.user, deployment=deployment).count() == 2

    page.get_by_label("Prompts, one a line").fill("one\ntwo")
    page.get_by_role("button", name="Run prompt set").click()
    expect(page.get_by_test_id("set-2-1")).to_contain_text("cannot be reached")
    expect(page.get_by_test_id(re.compile(r"history-\d+"))).to_have_count(4)
    _expected_failures(page)
    check_page(page, "playground-set")

    # what a reader could not see is shown by a sign, and the text itself is left as it came
    raw = "ROMEO:\n\tO\x0b\ufffd\ufffd!\u200b"
    models.PlaygroundRecord.objects.create(owner=page.user, deployment=deployment, model_name="unreachable",
                                           input="a byte-level answer", prompt="?", output=raw, completion_tokens=7)
    page.reload()
    answer = page.get_by_test_id(re.compile(r"history-\d+")).first.locator("[data-visible-text]")
    expect(answer.locator(".undecodable")).to_have_count(2)
    signs = answer.locator(".unseen").evaluate_all("spans => spans.map(s => getComputedStyle(s, '::before').content)")
    assert signs == ['"↵"', '"⇥"', '"⟨0x0B⟩"', '"⟨U+200B⟩"'] and answer.text_content() == raw
    assert not broken_words(page), broken_words(page)
    check_page(page, "playground-signs")


# Hands the page each server-sent event of a stream on its own, 2 ms after the one before: its tokens then arrive
# over more than 20 ms however fast the model decodes.
PACE_EVENTS = """() => {
  const fetchPage = window.fetch;
  window.fetch = async (...args) => {
    const response = await fetchPage(...args);
    if (!(response.headers.get("Content-Type") || "").includes("event-stream")) return response;
    const reader = response.body.getReader();
    const decoder = new TextDecoder(), encoder = new TextEncoder();
    let pending = "";
    const body = new ReadableStream({async pull(controller) {
      const {value, done} = await reader.read();
      if (done) {
        if (pending) controller.enqueue(encoder.encode(pending));
        controller.close();
        return;
      }
      pending += decoder.decode(value, {stream: true});
      let end;
      while ((end = pending.indexOf("\\n\\n")) >= 0) {
        controller.enqueue(encoder.encode(pending.slice(0, end + 2)));
        pending = pending.slice(end + 2);
        await new Promise(resolve => setTimeout(resolve, 2));
      }
    }});
    return new Response(body, {status: response.status, headers: response.headers});
  };
}"""


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
def test_the_playground_streams_a_real_answer_beside_another(signed_in_page, triton, served_checkpoint):
    from deploy.export import ExportOptions, export

    page = signed_in_page
    export(served_checkpoint, triton.repository, ExportOptions(name="browser-served", measure=False))
    client = triton.client()
    client.load("browser-served")
    try:
        grpc = models.TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                                  model_repository=str(triton.repository))
        http = models.TritonServer.objects.create(name="local-http", http_url=triton.http_url, grpc_url="",
                                                  model_repository=str(triton.repository))
        checkpoint = serving.imported(page.user, served_checkpoint)
        first, second = (serving.deployment(page.user, checkpoint, s, "browser-served", ready_at=timezone.now())
                         for s in (grpc, http))
        page.goto(f"/playground/?deployment={first.pk}")
        page.get_by_label("Compare with").select_option(str(second.pk))
        page.get_by_label("Input").fill("ROMEO:\n")
        page.get_by_label("Max tokens").fill("24")
        page.get_by_role("button", name="Generate").click()
        for n in (1, 2):
            expect(page.get_by_test_id(f"counts-{n}")).to_contain_text("completion 24 tokens", timeout=60_000)
            expect(page.get_by_test_id(f"counts-{n}")).to_contain_text(re.compile(r"prompt \d+ tokens"))
            expect(page.get_by_test_id(f"ttft-{n}")).to_contain_text(re.compile(r"time to first token [\d.,]+ ms"))
            # a rate, unless the stream was read in one burst (seen over gRPC on a busy machine): that is not timed
            expect(page.get_by_test_id(f"tps-{n}")).to_have_text(
                re.compile(r"[\d.,]+ tokens/s|– tokens/s \(arrived within 20 ms\)"))
        texts = [page.get_by_test_id(f"output-{n}").text_content() for n in (1, 2)]
        assert texts[0] and texts[0] == texts[1]  # greedy: the same model answers the same over gRPC and HTTP
        expect(page.get_by_test_id(re.compile(r"history-\d+"))).to_have_count(2)
        records = models.PlaygroundRecord.objects.filter(owner=page.user)
        assert {r.output for r in records} == {texts[0]} and all(r.ttft_ms for r in records)
        for r in records:  # kept as shown
            shown = page.get_by_test_id(f"tps-{1 if r.deployment_id == first.pk else 2}").text_content()
            assert (r.tokens_per_s is None) == shown.startswith("–"), (r.tokens_per_s, shown)
        check_page(page, "playground-streamed", phone=True)
        # Copy text takes the text as it came, the signs drawn for what could not be seen left out
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        page.get_by_role("button", name="Copy text of output 1").click()
        expect(page.get_by_role("button", name=re.compile("^Copied"))).to_be_visible()
        assert page.evaluate("() => navigator.clipboard.readText()") == texts[0]

        # alone over HTTP: 48 tokens are timed; 2 are too few, and no tokens/s is made of them. (The model's context is
        # 64 tokens: more, with the prompt, is refused as /v1 refuses it.) The tiny model decodes 48 tokens within
        # the 20 ms a rate needs, so the page is given its events a few milliseconds apart, as a slower link would.
        page.goto(f"/playground/?deployment={second.pk}")
        page.evaluate(PACE_EVENTS)
        page.get_by_label("Input").fill("ROMEO:\n")
        output = page.get_by_test_id("output-1")
        for tokens, rate in ((48, re.compile(r"^[\d.,]+ tokens/s$")), (2, "– tokens/s (fewer than 8 tokens)")):
            page.get_by_label("Max tokens").fill(str(tokens))
            page.get_by_role("button", name="Generate").click()
            expect(page.get_by_test_id("counts-1")).to_contain_text(f"completion {tokens} tokens", timeout=60_000)
            expect(page.get_by_test_id("tps-1")).to_have_text(rate)
            expect(page.get_by_role("button", name="Generate")).to_be_enabled()
            # each character a reader could not see is shown by its sign as it streams in
            text = output.text_content()
            expect(output.locator(".unseen")).to_have_count(
                sum(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text))
            expect(output.locator(".undecodable")).to_have_count(text.count("\ufffd"))
        shorter, longer = models.PlaygroundRecord.objects.filter(owner=page.user).order_by("-id")[:2]
        assert longer.tokens_per_s > 0 and shorter.tokens_per_s is None
    finally:
        client.unload("browser-served")
        client.close()
