"""The admin, as staff meet it: clusters, Triton servers, users and groups, runs with their state read-only."""
from playwright.sync_api import expect

from tests.browser.conftest import check_page
from trainer.contract import presets
from webapp import models


def test_it_shows_staff_the_admin_pages_without_a_serious_accessibility_problem(signed_in_page):
    page = signed_in_page
    page.user.is_staff = page.user.is_superuser = True
    page.user.save()
    cluster = models.Cluster.objects.create(name="a100s", kind=models.Cluster.Kind.SLURM, partition="gpu",
                                            account="lab", spec=presets.cluster("A100-SXM-80GB", 4, 8).to_dict())
    page.goto("/admin/")
    expect(page.get_by_role("link", name="Triton servers")).to_be_visible()
    expect(page.get_by_role("link", name="Groups")).to_be_visible()
    check_page(page, "admin")
    page.goto(f"/admin/workbench/cluster/{cluster.pk}/change/")
    expect(page.get_by_label("Partition")).to_have_value("gpu")
    check_page(page, "admin-cluster")
    for path in ("/admin/workbench/run/", "/admin/workbench/run/add/", "/admin/workbench/tritonserver/add/",
                 "/admin/workbench/deployment/add/", "/admin/auth/user/", f"/admin/auth/user/{page.user.pk}/change/",
                 "/admin/auth/group/add/", "/admin/workbench/dataroot/add/", "/admin/workbench/prompttemplate/add/",
                 "/admin/workbench/playgroundrecord/"):
        page.goto(path)
        check_page(page, "admin-" + path.strip("/").replace("/", "-"))
