"""The New-run wizard: the demo's defaults, the live estimate, inline contract errors, the tuner, and a launch that
makes the model config, the plan and a queued run."""
import html as html_module
import re

import pytest

from trainer.contract import SCHEMA_VERSION, presets
from trainer.planner.tune.api import tune_json
from webapp import models
from webapp.pages.wizard_forms import MODEL_FIELDS, default_data
from webapp.services.demo import demo_ready

pytestmark = pytest.mark.django_db

NEW, ESTIMATE, TUNE = "/runs/new/", "/runs/new/estimate/", "/runs/new/tune/"


@pytest.fixture
def runs_root(settings, tmp_path):
    settings.WORKBENCH = {**settings.WORKBENCH, "RUNS_ROOT": tmp_path / "runs", "RUNS_ROOTS": [tmp_path / "runs"]}
    return tmp_path / "runs"


@pytest.fixture
def signed_in(client, alice):
    client.force_login(alice)
    return client


def fields(user, **changes) -> dict:
    """The wizard's default fields, as the browser posts them, with ``changes`` (None leaves a box unchecked)."""
    data = default_data(user)
    for key, value in changes.items():
        name = key.replace("__", "-", 1)
        if value is None:
            data.pop(name, None)
        else:
            data[name] = str(value)
    return data


def figure_text(html: str, name: str) -> str:
    found = re.search(rf'data-testid="{name}">([^<]*)<', html)
    assert found, f"no {name} in the answer"
    return found.group(1).strip()


def error_list(html: str, name: str) -> str:
    found = re.search(rf'<ul id="errors-{name}"[^>]*>(.*?)</ul>', html, re.S)
    assert found, f"no error list for {name}"
    return found.group(1)


def test_it_sends_a_visitor_who_is_not_signed_in_to_the_sign_in_page(client, db):
    for url in (NEW, ESTIMATE, TUNE):
        answer = client.post(url) if url != NEW else client.get(url)
        assert answer.status_code == 302 and answer["Location"] == f"/login/?next={url}"


def test_it_opens_on_the_demo_defaults_with_their_estimate(signed_in, alice):
    answer = signed_in.get(NEW)
    assert answer.status_code == 200
    html = answer.content.decode()
    cluster, dataset = demo_ready(alice)
    assert f'<option value="{cluster.pk}" selected data-world="2">local</option>' in html
    assert f'<option value="{dataset.pk}" selected>shakespeare (demo)</option>' in html
    assert (f'<option value="preset:tiny" selected data-spec="{{&quot;schema_version&quot;: {SCHEMA_VERSION}, '
            '&quot;n_layers&quot;: 4') in html  # the preset's own figures, for the page's script
    for name, value in (("model-n_layers", 2), ("plan-dp", 2), ("plan-tp", 1), ("plan-micro_batch", 2),
                        ("plan-global_batch", 4), ("run-steps", 30), ("run-checkpoint_every", 30)):
        assert re.search(rf'name="{name}" value="{value}"', html), name
    assert re.search(r'name="run-profile"[^>]*checked', html)
    assert 'name="plan-precision"' in html and '<option value="fp32" selected>' in html
    # the estimate is there at once, with its formulas on demand
    assert figure_text(html, "estimate-step-time").endswith("ms")
    assert re.fullmatch(r"[\d.]+ MB", figure_text(html, "estimate-memory"))  # a tiny model: megabytes
    assert "<details><summary>formula" in html and "B · s / step" in html
    assert "optimizer states" in html and 'class="seg seg-activations" style="width:' in html
    assert 'hx-post="/runs/new/estimate/"' in html and 'hx-trigger="input changed delay:300ms, change"' in html


def test_the_estimate_follows_tp(signed_in, alice):
    dp2 = signed_in.post(ESTIMATE, fields(alice, plan__dp=2, plan__tp=1)).content.decode()
    tp2 = signed_in.post(ESTIMATE, fields(alice, plan__dp=1, plan__tp=2)).content.decode()
    assert "estimate-none" not in dp2 and "estimate-none" not in tp2
    assert figure_text(dp2, "estimate-memory") != figure_text(tp2, "estimate-memory")
    assert figure_text(dp2, "estimate-step-time") != figure_text(tp2, "estimate-step-time")
    assert "tensor_parallel" in tp2 and "tensor_parallel" not in dp2  # the step time's formula has a tp term
    for html in (dp2, tp2):  # every field's error list comes back out of band, empty
        assert re.search(r'<ul id="errors-plan-tp" class="errorlist" data-errors-for="id_plan-tp" '
                         r'hx-swap-oob="true"></ul>', html)


def test_the_estimate_says_which_engines_will_serve_the_model_before_it_is_trained(signed_in, alice):
    """The demo's default model has head_dim 16 (d_model 64 over 4 heads): vLLM's CPU attention has no kernel for
    it, which the deploy page would be the first to say after training; a width giving head_dim 32 is served."""
    def serving(html: str) -> list[str]:
        listed = html.split('data-testid="estimate-serving">')[1].split("</ul>")[0]
        items = (html_module.unescape(re.sub(r"<[^>]+>", " ", item)) for item in listed.split("<li>")[1:])
        return [" ".join(item.split()) for item in items]

    default = serving(signed_in.post(ESTIMATE, fields(alice)).content.decode())
    assert default[0] == "Workbench engine on a CPU server: serves it"
    assert default[1].startswith("vLLM on a CPU server: refused head_dim 16 (d_model 64 / n_heads 4): vLLM's CPU "
                                 "attention has kernels for head sizes 32, 64")
    assert default[2:] == ["Workbench engine on a GPU server: serves it", "vLLM on a GPU server: serves it"]
    wider = serving(signed_in.post(ESTIMATE, fields(alice, model__d_model=128)).content.decode())
    assert all(line.endswith("serves it") for line in wider), wider


def test_an_invalid_tp_is_refused_next_to_the_field_naming_the_numbers(signed_in, alice):
    html = signed_in.post(ESTIMATE, fields(alice, plan__dp=1, plan__tp=3)).content.decode()
    assert "estimate-none" in html
    assert "tp=3 does not divide n_heads=4" in error_list(html, "plan-tp")
    assert "dp×cp×tp×pp=1×1×3×1=3 but the cluster has 2 GPUs" in error_list(html, "plan")
    # a model figure and a run figure land on their own fields
    html = signed_in.post(ESTIMATE, fields(alice, model__n_heads=5, run__steps=0)).content.decode()
    assert "n_heads=5 does not divide d_model=64" in error_list(html, "model-n_heads")
    html = signed_in.post(ESTIMATE, fields(alice, run__steps=0)).content.decode()
    assert "steps=0 must be positive" in error_list(html, "run-steps")
    assert "estimate-step-time" in html  # the plan is fine: its estimate still shows
    html = signed_in.post(ESTIMATE, fields(alice, run__profile_steps=0)).content.decode()
    assert "steps=0 must be positive" in error_list(html, "run-profile_steps")
    html = signed_in.post(ESTIMATE, fields(alice, plan__tp="two")).content.decode()
    assert "Enter a whole number." in error_list(html, "plan-tp")


def test_the_budget_gives_time_and_cost(signed_in, alice):
    html = signed_in.post(ESTIMATE, fields(alice, run__token_budget=1e6, run__gpu_hour_cost=2)).content.decode()
    assert figure_text(html, "estimate-budget-steps") == "3,907 steps"  # ⌈1e6 / (4 · 64)⌉
    cost = figure_text(html, "estimate-cost")  # in the currency the rate is typed in, said on both
    assert re.fullmatch(r"[\d.]+ USD \(at 2 USD per process-hour\)", cost) and not cost.startswith("0.00")
    assert "Cost per GPU-hour (USD)" in signed_in.get(NEW).content.decode()
    assert figure_text(html, "estimate-budget-time")
    html = signed_in.post(ESTIMATE, fields(alice, run__token_budget=1e6)).content.decode()
    assert figure_text(html, "estimate-cost") == "– (give a cost per GPU-hour)"  # the local cluster has none
    html = signed_in.post(ESTIMATE, fields(alice, run__token_budget=0)).content.decode()
    assert error_list(html, "run-token_budget")


def test_the_estimate_names_cpu_ranks_processes_and_says_whose_memory_it_holds_them_against(signed_in, alice,
                                                                                             cluster8):
    html = signed_in.get(NEW).content.decode()  # the local cluster: two CPU processes
    text = re.sub(r"\s+", " ", html)
    assert "2 CPU processes ·" in text and "Memory per process" in text and "GPU·h" not in text
    assert 'data-testid="estimate-band"' not in text  # no caching allocator, no range
    assert not re.search(r"(memory|peak) per GPU", text, re.I)
    assert figure_text(html, "estimate-capacity").startswith(
        "Against 24 GB, the memory the cpu preset plans for each process (not this machine&#x27;s memory).")
    html = signed_in.post(ESTIMATE, fields(alice, run__cluster=cluster8.pk, plan__dp=8, plan__global_batch=16))
    text = re.sub(r"\s+", " ", html.content.decode())
    assert "8 A100-SXM-80GB GPUs ·" in text and "Memory per GPU" in text and "process" not in text
    assert "Against 85.9 GB, the A100-SXM-80GB&#x27;s memory." in text and "A100-SXM-80GB-hours" not in text
    # a GPU's overheads make the peak a range, and the high end decides whether it fits
    band = re.search(r'data-testid="estimate-band">As expected; from ([\d.,]+ [kMG]B) to ([\d.,]+ [kMG]B) as', text)
    assert band and band[1] != band[2] and f"It fits only if {band[2]} does." in text
    assert re.search(r'data-testid="estimate-budget-gpu-hours">[\d.,]+ GPU-hours<', text)


def test_a_stored_model_config_is_a_source(signed_in, alice, bob):
    mine = models.ModelConfig.objects.create(owner=alice, name="mine", spec=presets.MODELS["tiny"].to_dict())
    private = models.ModelConfig.objects.create(owner=bob, name="bobs", spec=presets.MODELS["tiny"].to_dict())
    html = signed_in.get(NEW).content.decode()
    assert f'value="config:{mine.pk}"' in html and f'value="config:{private.pk}"' not in html
    answer = signed_in.post(ESTIMATE, fields(alice, model__source=f"config:{private.pk}")).content.decode()
    assert "Select a valid choice" in error_list(answer, "model-source")


def test_the_tuner_ranks_plans_marks_the_front_and_counts_the_rejected(signed_in, alice):
    html = signed_in.post(TUNE, fields(alice, plan__global_batch=8)).content.decode()
    ranked = re.search(r'data-testid="tune-ranked">(.*?)</table>', html, re.S).group(1)
    buttons = re.findall(r'data-plan="([^"]*)"', ranked)
    assert len(buttons) == 10
    assert "&quot;global_batch&quot;: 8" in buttons[0] and "&quot;dp&quot;:" in buttons[0]
    assert "on the front" in ranked and 'data-testid="tune-pareto"' in html and "<svg class=\"pareto\"" in html
    rejected = re.search(r'data-testid="tune-excluded">(.*?)</table>', html, re.S).group(1)
    assert re.search(r"<td>[^<]+</td><td class=\"num\">\d+</td>", rejected)
    # a tp the heads refuse does not stop the tuner: it is how to find one they take
    assert "data-plan=" in signed_in.post(TUNE, fields(alice, plan__tp=3)).content.decode()
    refused = signed_in.post(TUNE, fields(alice, model__d_model=65)).content.decode()
    assert "No tune for these fields" in refused and "n_heads=4 does not divide d_model=65" in refused


def _numbers(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<td class="num">(\d+)</td>', html)]


def test_the_tune_summary_adds_up_and_says_what_it_counts(signed_in, alice):
    """Plans estimated = plans that fit + plans too large; the choices the rules excluded are counted apart."""
    gpt2 = presets.MODELS["gpt2-small"]  # on two CPU processes, some of its plans fit and some do not
    data = fields(alice, model__n_layers=gpt2.n_layers, model__d_model=gpt2.d_model, model__n_heads=gpt2.n_heads,
                  model__seq_len=gpt2.seq_len, model__vocab_size=gpt2.vocab_size, plan__global_batch=64)
    html = signed_in.post(TUNE, data).content.decode()
    cluster = demo_ready(alice)[0].spec
    result = tune_json({"model": gpt2.to_dict(), "cluster": cluster, "global_batch": 64, "top_k": 10,
                        "explain_top": 0})
    too_large = result["evaluated"] - result["fitting"]
    excluded = sum(n for reason, n in result["rejected"].items() if not reason.startswith("out of memory"))
    assert result["fitting"] and too_large and excluded  # the three counts the page must tell apart
    summary = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", re.search(
        r'data-testid="tune-summary">(.*?)</p>', html, re.S).group(1)))
    assert (f"{result['evaluated']} plans estimated for global_batch 64 in " in summary
            and f": {result['fitting']} fit in memory, {too_large} do not. " in summary
            and f"the rules excluded {excluded} choices" in summary), summary
    too_large_table = re.search(r'data-testid="tune-too-large">(.*?)</table>', html, re.S).group(1)
    excluded_table = re.search(r'data-testid="tune-excluded">(.*?)</table>', html, re.S).group(1)
    assert sum(_numbers(too_large_table)) == too_large and f"too large for memory: {too_large} plans" in too_large_table
    assert sum(_numbers(excluded_table)) == excluded and f"before estimating: {excluded} choices" in excluded_table
    assert "out of memory" not in excluded_table


def test_launch_makes_the_config_the_plan_and_a_queued_run_and_opens_its_page(signed_in, alice, runs_root, sent,
                                                                              django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        answer = signed_in.post(NEW, fields(alice))
    run = models.Run.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/runs/{run.pk}/"
    assert run.owner == alice and run.status == models.RunStatus.QUEUED and sent == [("workbench.runs.launch", run.pk)]
    assert (run.name, run.steps, run.checkpoint_every, run.eval_every) == ("tiny demo", 30, 30, 10)
    assert run.profile == {"schema_version": SCHEMA_VERSION, "start_step": 5, "steps": 3, "warmup": 1, "name": "default"}
    assert run.model_config.owner == alice and run.model_config.name == "tiny"
    assert run.model_config.model_spec() == presets.MODELS["tiny"].replace(n_layers=2)
    assert run.plan.plan_spec().world_size == 2 and run.plan.cluster.name == "local"
    assert run.spec["plan"]["dp"] == 2 and run.spec["steps"] == 30
    # the same fields again: the same config and plan, a second run
    with django_capture_on_commit_callbacks(execute=True):
        signed_in.post(NEW, fields(alice, run__name="again", plan__dp=1, plan__tp=2))
    assert models.ModelConfig.objects.count() == 1 and models.ParallelismPlan.objects.count() == 2
    # a config of that name with another spec: a new name
    with django_capture_on_commit_callbacks(execute=True):
        signed_in.post(NEW, fields(alice, model__n_layers=4, run__profile=None))
    names = set(models.ModelConfig.objects.values_list("name", flat=True))
    assert names == {"tiny", "tiny-2"} and models.Run.objects.filter(profile__isnull=True).count() == 1


def test_launch_with_a_second_dataset_makes_a_blended_run(signed_in, alice, runs_root, sent,
                                                         django_capture_on_commit_callbacks):
    _, dataset = demo_ready(alice)
    web = models.Dataset.objects.create(owner=alice, name="web text", path=dataset.path)
    with django_capture_on_commit_callbacks(execute=True):
        answer = signed_in.post(NEW, fields(alice, run__blend_with=web.pk, run__blend_weight=0.5))
    run = models.Run.objects.get()
    assert answer.status_code == 302 and run.blend == [{"dataset": web.pk, "weight": 0.5, "name": "web-text"}]
    assert [(s["name"], s["weight"]) for s in run.spec["blend"]] == [("web-text", 0.5)]
    assert 'data-names="val_loss:main,val_loss:web-text"' in signed_in.get(answer["Location"]).content.decode()
    refused = signed_in.post(NEW, fields(alice, run__blend_with=web.pk, run__blend_weight=0))
    assert refused.status_code == 400 and "greater than or equal to" in error_list(refused.content.decode(),
                                                                                   "run-blend_weight")


def test_launch_with_an_error_makes_nothing_and_says_why_by_the_field(signed_in, alice, runs_root, sent):
    answer = signed_in.post(NEW, fields(alice, plan__dp=1, plan__tp=3))
    assert answer.status_code == 400
    html = answer.content.decode()
    assert "The run was not launched" in html and 'aria-invalid="true"' in html
    assert "tp=3 does not divide n_heads=4" in error_list(html, "plan-tp")
    answer = signed_in.post(NEW, fields(alice, run__steps=-5))
    assert answer.status_code == 400 and "steps=-5 must be positive" in error_list(answer.content.decode(), "run-steps")
    assert not models.Run.objects.exists() and not models.ModelConfig.objects.exists() and not sent


def _preset_fields(user, preset: str, **changes) -> dict:
    """The fields as the page's script fills them on choosing ``preset``, with ``changes``."""
    spec = presets.MODELS[preset]
    model = {f"model__{n}": getattr(spec, n) for n in MODEL_FIELDS}
    model = {k: ("on" if v is True else None if v is False else v) for k, v in model.items()}
    return fields(user, model__source=f"preset:{preset}", **{**model, **changes})


def test_it_offers_the_families_with_their_shapes(signed_in):
    html = signed_in.get(NEW).content.decode()
    for group in ("GPT presets", "Llama presets", "Mixtral presets", "Qwen2-MoE presets"):
        assert f'<optgroup label="{group}">' in html
    assert ">llama3-8b (32 × 4096, 32 heads, 8 KV)</option>" in html
    assert ">mixtral-8x7b (32 × 4096, 32 heads, 8 KV, 8 experts top-2)</option>" in html


def test_a_llama_estimate_shows_context_parallel_and_each_uneven_stage(signed_in, alice):
    html = signed_in.post(ESTIMATE, _preset_fields(alice, "tiny-llama", plan__dp=1, plan__cp=2)).content.decode()
    assert figure_text(html, "estimate-shape") == "dp 1 × cp 2 × tp 1 × pp 1"
    assert figure_text(html, "estimate-context-parallel").endswith("s")  # the ring's time left exposed
    uneven = _preset_fields(alice, "tiny-llama", model__n_layers=3, plan__dp=1, plan__pp=2,
                            plan__stage_layers="2, 1", plan__global_batch=4)
    html = signed_in.post(ESTIMATE, uneven).content.decode()
    assert figure_text(html, "estimate-shape") == "dp 1 × tp 1 × pp 2"
    stages = re.findall(r'data-testid="estimate-stage-(\d)"><td>[^<]*</td><td>(\d+)</td><td>([^<]*)</td>', html)
    assert stages == [("0", "0", "0–1"), ("1", "1", "2")]
    bad = signed_in.post(ESTIMATE, {**uneven, "plan-stage_layers": "2, x"}).content.decode()
    assert "give whole numbers separated by commas" in error_list(bad, "plan-stage_layers")
    short = signed_in.post(ESTIMATE, {**uneven, "plan-stage_layers": "2, 2"}).content.decode()
    assert "stage_layers=[2, 2] adds up to 4 layers but the model has 3" in error_list(short, "plan-stage_layers")
