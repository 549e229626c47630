"""The dataset pages in the browser: a JSONL dataset with a bad row registered by its path, prepared as a batch job
on the test Slurm cluster that the session's worker submits and follows, and its report read on its page."""
import json

from playwright.sync_api import expect

from tests.browser.conftest import check_page
from tests.xdist_groups import data_roots
from trainer.contract import presets
from webapp import models


def test_a_jsonl_dataset_registered_on_its_page_is_prepared_on_slurm_and_reports_its_bad_row(
        signed_in_page, broker, slurm_cluster, settings, tmp_path_factory, tmp_path):
    page = signed_in_page
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": data_roots(tmp_path_factory)}
    models.Cluster.objects.create(name="hpc", kind="slurm", partition=slurm_cluster.partition,
                                  spec=presets.cluster("cpu", nodes=1, gpus_per_node=1).to_dict())
    lines = presets.demo_text(300 * 80).decode().split("\n")
    path = tmp_path / "rows.jsonl"
    path.write_text("".join("{oops\n" if n == 5 else json.dumps({"body": lines[n] or "."}) + "\n"
                            for n in range(1, 301)))

    page.goto("/datasets/")
    page.get_by_label("Name").fill("rows")
    page.get_by_label("Path").fill(str(path))
    page.get_by_label("Text field").fill("body")
    page.get_by_role("button", name="Register").click()
    expect(page.get_by_role("heading", name="Dataset rows")).to_be_visible()
    page.get_by_label("Model vocabulary").fill("300")
    page.get_by_label("Run on").select_option(label="hpc")
    page.get_by_test_id("prepare").click()
    expect(page.get_by_text("is queued")).to_be_visible()
    preparation = models.DatasetPreparation.objects.get()
    expect(page.get_by_test_id(f"preparation-status-{preparation.pk}")).to_have_text("done", timeout=90_000)
    preparation.refresh_from_db()
    expect(page.locator(f"#preparation-{preparation.pk}")).to_contain_text(f"on hpc as Slurm job {preparation.job_id}")
    expect(page.get_by_test_id(f"preparation-bad-rows-{preparation.pk}")).to_contain_text(
        "1 of 300 rows could not be read")
    expect(page.locator(".bad-rows")).to_contain_text("rows.jsonl:5: not JSON")
    expect(page.get_by_test_id(f"preparation-message-{preparation.pk}")).to_contain_text("training and")
    check_page(page, "dataset", phone=True)

    page.goto("/datasets/")  # the list links to it; a path outside the data roots is refused by its field
    expect(page.get_by_role("link", name="rows")).to_be_visible()
    page.get_by_label("Name").fill("elsewhere")
    page.get_by_label("Path").fill("/etc/passwd")
    page.get_by_role("button", name="Register").click()
    expect(page.locator("#id_path-errors")).to_contain_text("data root")
    check_page(page, "datasets")
