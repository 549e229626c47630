"""A Llama-family model in the browser, on the real parts: the tiny Llama preset chosen in the wizard, estimated
with its sequences split over two context-parallel ranks, launched and trained by the session's Celery worker with
torchrun, deployed on the session's Triton and exported to the Hugging Face layout from the deploy page."""
import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import check_page
from tests.browser.test_first_runs_to_the_playground import (DEPLOY_SECONDS, RUN_SECONDS, deploy_from_the_deploy_page,
                                                             reconciling)
from webapp import models

EXPORT_SECONDS = 120_000  # ms: the export process started by the worker, written and renamed into place


@pytest.mark.slow
@pytest.mark.once  # a worker, torchrun and the real Triton: once, on the first database
def test_a_tiny_llama_goes_from_the_wizard_with_cp2_to_triton_and_the_hugging_face_layout(
        signed_in_page, broker, triton, settings, tmp_path):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs",
                          "CONVERSIONS_ROOT": tmp_path / "conversions"}
    models.TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                       metrics_url=triton.metrics_url, model_repository=str(triton.repository))
    page = signed_in_page

    # the wizard: the Llama preset fills the model's fields; cp=2 takes both ranks, dp follows
    page.goto("/runs/new/")
    page.get_by_label("Start from").select_option("preset:tiny-llama")
    expect(page.get_by_label("norm", exact=True)).to_have_value("rmsnorm")
    expect(page.get_by_label("activation", exact=True)).to_have_value("swiglu")
    page.get_by_label("cp", exact=True).fill("2")
    page.get_by_label("cp", exact=True).dispatch_event("change")
    expect(page.get_by_label("dp", exact=True)).to_have_value("1")
    expect(page.get_by_test_id("estimate-shape")).to_have_text("dp 1 × cp 2 × tp 1 × pp 1")
    expect(page.get_by_test_id("estimate-context-parallel")).not_to_be_empty()
    page.get_by_label("Run name").fill("llama cp2")
    check_page(page, "llama-wizard-cp2")
    page.get_by_test_id("launch").click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = models.Run.objects.get(name="llama cp2")
    assert run.plan.spec["cp"] == 2 and run.model_config.spec["activation"] == "swiglu"

    with reconciling(broker):
        expect(page.get_by_test_id("run-status")).to_have_text("completed", timeout=RUN_SECONDS)
    checkpoint = models.Checkpoint.objects.filter(run=run).latest("step")

    deployment = deploy_from_the_deploy_page(page, checkpoint, "none")
    with reconciling(broker, every=5.0):
        expect(page.get_by_test_id(f"deployment-status-{deployment.pk}")).to_have_text("ready",
                                                                                       timeout=DEPLOY_SECONDS)
    expect(page.get_by_test_id(f"deployment-smoke-{deployment.pk}")).to_have_text("passed")

    # the Hugging Face layout: the export is queued, followed on the page, and written where the row says
    page.get_by_label("Checkpoint to export").select_option(str(checkpoint.pk))
    page.get_by_test_id("export-hf").click()
    expect(page.locator("[data-testid^=conversion-status-]")).to_have_count(1)
    conversion = models.CheckpointConversion.objects.get(checkpoint=checkpoint)
    expect(page.get_by_test_id(f"conversion-status-{conversion.pk}")).to_have_text("done", timeout=EXPORT_SECONDS)
    target = Path(page.get_by_test_id(f"conversion-target-{conversion.pk}").inner_text())
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "llama" and (target / "tokenizer.json").exists()
    check_page(page, "llama-deploy-export")
