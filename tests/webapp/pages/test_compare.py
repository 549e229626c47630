"""The compare page: the runs you may see to choose from, the chosen ones (from the address, as a list or repeated)
charted by the page's script, and the fields of their plans and models that differ."""
import pytest

from tests.webapp.live_runs import append_metrics, new_run, step_record
from trainer.contract import ParallelPlan
from webapp import models

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_runs(alice, plan222, gpt2_small, cluster8, corpus):
    dp4 = models.ParallelismPlan.objects.create(owner=alice, name="dp4", model_config=gpt2_small, cluster=cluster8,
                                                spec=ParallelPlan(dp=4, tp=2, micro_batch=2, global_batch=16).to_dict())
    first = new_run(alice, plan222, corpus, name="first")
    second = new_run(alice, dp4, corpus, name="second")
    append_metrics(first, [step_record(s, 4.0 - s / 100) for s in range(1, 41)])
    append_metrics(second, [step_record(s, 3.5 - s / 100, tokens_per_step=2048) for s in range(1, 21)])
    return first, second


def _page(client, user, query=""):
    client.force_login(user)
    return client.get(f"/compare/{query}")


def test_it_lists_what_differs_between_the_runs_in_the_address(client, alice, two_runs):
    first, second = two_runs
    answer = _page(client, alice, f"?ids={first.pk},{second.pk}")
    assert answer.status_code == 200
    html = answer.content.decode()
    assert 'data-testid="compare-chart"' in html and f'data-ids="{first.pk},{second.pk}"' in html
    assert 'data-testid="differences"' in html
    assert '<th scope="row" class="mono">plan.dp</th><td class="mono">2</td><td class="mono">4</td>' in html
    assert '<th scope="row" class="mono">plan.pp</th><td class="mono">2</td><td class="mono">1</td>' in html
    assert "plan.tp" not in html  # the same in both
    assert f'value="{first.pk}" id="pick-{first.pk}" checked' in html
    assert f'href="/runs/{second.pk}/"' in html


def test_it_takes_the_ids_as_checkboxes_send_them_and_keeps_their_order(client, alice, two_runs):
    first, second = two_runs
    html = _page(client, alice, f"?ids={second.pk}&ids={first.pk}&ids={second.pk}&series=mfu&x=tokens").content.decode()
    assert f'data-ids="{second.pk},{first.pk}"' in html
    assert '<td class="mono">4</td><td class="mono">2</td>' in html
    assert 'data-series-name="mfu" data-x="tokens"' in html and 'data-y-unit="fraction"' in html


def test_it_offers_the_runs_you_may_see_and_says_which_asked_for_it_cannot_show(client, alice, bob, two_runs,
                                                                                plan222, corpus):
    first, _ = two_runs
    hidden = new_run(alice, plan222, corpus, name="hidden")
    shared = new_run(alice, plan222, corpus, name="shared", shared=True)
    html = _page(client, bob, f"?ids={hidden.pk},{shared.pk},x").content.decode()
    assert f"No run {hidden.pk} that you can see." in html and "Not a run id: x." in html
    assert f'id="pick-{shared.pk}"' in html and f'id="pick-{hidden.pk}"' not in html
    assert f'id="pick-{first.pk}"' not in html
    assert f'data-ids="{shared.pk}"' in html and "Choose at least two runs" in html


def test_it_shows_the_picker_alone_without_runs_and_sends_strangers_to_sign_in(client, alice, two_runs):
    answer = client.get("/compare/?ids=1")
    assert answer.status_code == 302 and answer["Location"] == "/login/?next=/compare/%3Fids%3D1"
    html = _page(client, alice).content.decode()
    assert 'data-testid="compare-chart"' not in html and 'name="ids"' in html


def test_it_compares_at_most_ten_runs(client, alice, plan222, corpus):
    runs = [new_run(alice, plan222, corpus, name=f"r{i}") for i in range(11)]
    html = _page(client, alice, "?ids=" + ",".join(str(r.pk) for r in runs)).content.decode()
    assert "At most 10 runs are compared at once" in html
    assert f'data-ids="{",".join(str(r.pk) for r in runs[:10])}"' in html
