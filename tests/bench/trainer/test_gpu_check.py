"""The GPU check's arithmetic on known numbers, its plan choice, and one tiny run of the whole script on the CPU."""
import ast
import json
import math
from pathlib import Path

import pytest
import torch

from bench.trainer import gpu_check
from bench.trainer import gpu_figures as G
from bench.trainer.gpu_check import HEADROOM, MICRO_BATCHES, bf16_plan, choose_plan, main
from trainer.contract.presets import MODELS, cluster, local_cpu_cluster
from trainer.planner.estimate import Planner, count, inference_estimate

REPO = Path(__file__).resolve().parents[3]
H200 = cluster("H200-SXM", 1, gpus_per_node=1)
GPT13 = MODELS["gpt3-1.3b"]


# ---- verdicts at the thresholds ---------------------------------------------------------------------------------

def test_targets_met_exactly_pass_and_a_hair_below_fails():
    assert G.mfu_row(0.45).passed and not G.mfu_row(0.4499).passed
    assert G.memory_row(100.0, 105.0).passed and G.memory_row(100.0, 95.0).passed
    assert not G.memory_row(100.0, 105.01).passed
    at_target = {"batch": 1, "tokens_per_s": 600.0, "step_s": 1 / 600}
    assert G.decode_rows([at_target], {1: 1000.0}, {1: 900.0}, 24)[0].passed
    assert not G.decode_rows([{**at_target, "tokens_per_s": 599.9}], {1: 1000.0}, {1: 900.0}, 24)[0].passed


def test_the_memory_error_is_relative_to_the_measurement():
    row = G.memory_row(200.0, 190.0)
    assert row.figure == pytest.approx(0.05) and row.measured == 200.0 and row.reference == 190.0
    assert G.relative_error(80.0, 100.0) == pytest.approx(0.25)


def test_a_limit_line_is_kept_only_for_a_missed_target():
    assert G.mfu_row(0.5, "why").limit == "" and G.mfu_row(0.3, "why").limit == "why"
    assert G.memory_row(1.0, 1.0, "why").limit == "" and G.memory_row(1.0, 2.0, "why").limit == "why"


# ---- training figures --------------------------------------------------------------------------------------------

def _record(step, step_time, mfu, peak):
    memory = {"params_bytes": 100, "grads_bytes": 100, "optimizer_bytes": 200, "activations_bytes": 50,
              "max_allocated_bytes": peak}
    return {"step": step, "loss": 10.0 - step, "lr": 1e-4, "grad_norm": 1.0, "tokens_per_s": 1000 / step_time,
            "step_time_s": step_time, "mfu": mfu, "tokens_seen": step, "memory": memory}


def test_training_measurement_takes_medians_after_warm_up_and_the_largest_peak():
    records = [_record(1, 9.0, 0.01, 700), _record(2, 1.0, 0.5, 800), _record(3, 3.0, 0.3, 790),
               _record(4, 2.0, 0.4, 800), {"step": 4, "val_loss": 3.0}]
    got = G.training_measurement(records, warmup=1)
    assert (got["step_time_s"], got["mfu"], got["timed_steps"], got["steps"]) == (2.0, 0.4, 3, 4)
    assert (got["states_bytes"], got["activations_bytes"], got["max_allocated_bytes"]) == (400, 50, 800)
    assert (got["loss_first"], got["loss_last"]) == (9.0, 6.0)
    # fewer steps than the warm-up: the last step is still timed; a device without a peak gives None
    cpu = G.training_measurement([_record(1, 9.0, 0.1, None), _record(2, 4.0, 0.2, None)], warmup=5)
    assert (cpu["step_time_s"], cpu["timed_steps"], cpu["max_allocated_bytes"]) == (4.0, 1, None)


def test_the_planned_parts_are_what_the_allocator_hands_out_and_match_the_measured_keys():
    numbers = Planner(GPT13, H200).evaluate(bf16_plan(8, "none"))
    planned = G.planned_parts(numbers)
    stage = next(s for s in numbers.stages if s.stage == numbers.peak_stage)
    # the planner's peak less the overheads outside the allocator (CUDA context, driver reserve, fragmentation)
    assert sum(planned.values()) == pytest.approx(numbers.peak_bytes - stage.overhead, rel=1e-12)
    assert planned["rest"] == sum(stage.buffers.values()) > 0 and stage.overhead > 1e9
    gpu = {"states_bytes": 400, "activations_bytes": 50, "max_allocated_bytes": 1000}
    got, same = G.compared_parts(gpu, numbers)
    assert got == {"states": 400.0, "activations": 50.0, "rest": 550.0} and same == planned
    got, same = G.compared_parts({**gpu, "max_allocated_bytes": None}, numbers)
    assert set(got) == set(same) == {"states", "activations"}


def test_the_memory_limit_names_the_part_that_is_furthest_off():
    line = G.memory_limit({"states": 21e9, "activations": 30e9, "rest": 5e9},
                          {"states": 21.1e9, "activations": 36e9, "rest": 4e9})
    assert line == "activations: measured 30.00 GB, planned 36.00 GB (+6.00 GB)"


def test_the_memory_floor_is_optimizer_bytes_plus_a_cast_per_micro_batch_over_bandwidth():
    assert G.memory_floor_share(10**9, 1.0, 2, 1e12) == pytest.approx((32 + 2 * 6) * 1e9 / 1e12)


def test_the_mfu_limit_follows_the_figures():
    assert "recompute" in G.mfu_limit(0.01, "full", 0.5)
    assert "optimizer" in G.mfu_limit(0.2, "none", 0.5)
    assert "small matmuls" in G.mfu_limit(0.01, "none", 0.3)
    assert "fused" in G.mfu_limit(0.01, "none", 0.5)


# ---- decode bounds ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 16, 64])
def test_the_decode_bound_is_the_mean_of_every_steps_planner_bound(batch):
    prompt, new = 512, 128
    steps = [inference_estimate(GPT13, H200, batch=batch, context=prompt + i + 1)["decode_time_per_token"].value
             for i in range(new)]
    assert G.decode_bound(GPT13, H200, batch, prompt, new) == pytest.approx(batch * new / sum(steps), rel=1e-12)


def test_the_decode_bound_by_hand_and_with_the_cache_copied():
    n, L, h = count(GPT13).total, GPT13.n_layers, GPT13.d_model
    weights, kv = 2 * n, 2 * L * h * 2 * 4 * 100  # bf16 weights; keys and values of 4 sequences × 100 positions
    plain, copying = G.decode_step_bounds(GPT13, H200, batch=4, context=100)
    assert plain == pytest.approx((weights + kv) / 4.8e12, rel=1e-12)
    assert copying == pytest.approx((weights + 3 * kv) / 4.8e12, rel=1e-12)
    # one new token after a one-token prompt: both steps read a 1- and a 2-position cache
    first, last = (G.decode_step_bounds(GPT13, H200, 4, c)[0] for c in (2, 2))
    assert G.decode_bound(GPT13, H200, 4, 1, 1) == pytest.approx(4 / first)


def test_decode_rows_and_what_limits_each():
    measured = [{"batch": 16, "tokens_per_s": 5000.0, "step_s": 16 / 5000},
                {"batch": 1, "tokens_per_s": 600.0, "step_s": 1 / 600},
                {"batch": 64, "tokens_per_s": 1000.0, "step_s": 64 / 1000}]
    bounds = {1: 2000.0, 16: 10000.0, 64: 40000.0}
    copies = {1: 990.0, 16: 6000.0, 64: 20000.0}
    one, sixteen, big = G.decode_rows(measured, bounds, copies, 24)
    assert [r.name for r in (one, sixteen, big)] == [f"decode tokens/s, batch {b}" for b in (1, 16, 64)]
    assert (one.figure, sixteen.figure, big.figure) == (0.3, 0.5, 0.025)
    assert not any(r.passed for r in (one, sixteen, big))
    assert one.limit.startswith("host dispatch") and "×1.00 from batch 1" in one.limit
    assert sixteen.limit.startswith("the KV cache grows by torch.cat")  # step ×1.92 of batch 1; 5000 ≥ 0.7 · 6000
    assert big.limit.startswith("attention over the cache")  # step ×38 of batch 1, far below the copy bound
    flat = G.decode_rows([{"batch": 1, "tokens_per_s": 300.0, "step_s": 1 / 300},
                          {"batch": 16, "tokens_per_s": 4400.0, "step_s": 16 / 4400}], bounds, copies, 24)
    assert flat[1].limit.startswith("host dispatch")  # 16 sequences cost ×1.09 of one: not the bytes


def test_the_summary_has_one_line_per_target_with_its_verdict():
    rows = [G.mfu_row(0.5), G.memory_row(100.0, 120.0, "activations: off")]
    lines = G.summary_lines(rows)
    assert "PASS" in lines[0] and "≥ 0.45" in lines[0]
    assert "FAIL" in lines[1] and "≤ 0.05" in lines[1] and lines[1].endswith("— activations: off")


# ---- the plan -----------------------------------------------------------------------------------------------------

def test_the_plan_is_the_largest_micro_batch_the_planner_fits_with_headroom():
    plan, numbers = choose_plan(GPT13, H200)
    assert numbers.fits and numbers.peak_bytes <= HEADROOM * numbers.capacity_bytes
    assert (plan.precision, plan.activation_checkpointing, plan.global_batch) == ("bf16", "none", plan.micro_batch)
    larger = [b for b in MICRO_BATCHES if b > plan.micro_batch]
    planner = Planner(GPT13, H200)
    assert all(planner.evaluate(bf16_plan(b, "none")).peak_bytes > HEADROOM * numbers.capacity_bytes for b in larger)
    assert choose_plan(GPT13, H200, micro_batch=16)[0].micro_batch == 16  # asked for: fits in 141 GB, no headroom
    with pytest.raises(SystemExit, match="fits"):
        choose_plan(GPT13, H200, micro_batch=64)


def test_a_plan_that_runs_out_of_memory_is_retried_at_the_next_smaller_micro_batch(monkeypatch, tmp_path):
    tried = []

    def train(model, plan, clu, dataset, run_dir, steps):
        tried.append(plan.micro_batch)
        if plan.micro_batch > 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return [{"step": 1}]

    monkeypatch.setattr(gpu_check, "train", train)
    first = Planner(GPT13, H200).evaluate(bf16_plan(16, "none"))
    numbers, records, failed = gpu_check.train_what_fits(GPT13, H200, first, None, tmp_path, 3)
    assert (tried, failed, numbers.plan.micro_batch, records) == ([16, 12, 8], [16, 12], 8, [{"step": 1}])
    monkeypatch.setattr(gpu_check, "MICRO_BATCHES", (16, 12))
    with pytest.raises(SystemExit, match="every micro-batch down to 12"):
        gpu_check.train_what_fits(GPT13, H200, first, None, tmp_path, 3)


# ---- the whole script on the CPU -----------------------------------------------------------------------------------

def _numbers(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_a_tiny_cpu_run_writes_every_figure(tmp_path, dataset, capsys):
    out = tmp_path / "check"
    assert main(["--model", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1", "--micro-batch", "4",
                 "--decode-batches", "1,2", "--prompt-len", "8", "--decode-tokens", "2", "--decode-repeats", "1",
                 "--out", str(out), "--text", dataset.path, "--prepared-dir", dataset.prepared_dir]) == 0
    printed = capsys.readouterr().out
    assert "1. training tiny" in printed and "2. KV-cache decode tiny" in printed and "3. summary" in printed
    result = json.loads((out / "gpu_check.json").read_text())
    t = result["training"]
    for key in ("step_time_s", "mfu", "tokens_per_s", "planned_step_time_s", "planned_mfu", "peak_bytes",
                "planned_peak_bytes", "planned_full_peak_bytes", "capacity_bytes", "states_bytes",
                "activations_bytes", "memory_floor_share", "loss_first", "loss_last"):
        assert math.isfinite(t[key]) and t[key] > 0, key
    assert (t["steps"], t["timed_steps"]) == (2, 1)
    assert t["max_allocated_bytes"] is None and t["max_memory_allocated_bytes"] is None  # no allocator peak on CPU
    assert set(t["measured_parts"]) == {"states", "activations"}  # no allocator on the CPU
    assert t["peak_bytes"] == t["states_bytes"] + t["activations_bytes"]
    assert [d["batch"] for d in result["decode"]] == [1, 2]
    for d in result["decode"]:
        for key in ("prefill_s", "decode_s", "step_s", "tokens_per_s", "bound_tokens_per_s",
                    "bound_with_cache_copy_tokens_per_s", "fraction_of_bound"):
            assert math.isfinite(d[key]) and d[key] > 0, key
        assert d["bound_tokens_per_s"] == pytest.approx(
            G.decode_bound(MODELS["tiny"], local_cpu_cluster(1), d["batch"], 8, 2))
    names = [r["name"] for r in result["rows"]]
    assert names == ["training MFU", "peak memory, planner error", "decode tokens/s, batch 1",
                     "decode tokens/s, batch 2"]
    assert all(isinstance(r["passed"], bool) and (r["passed"] or r["limit"]) for r in result["rows"])
    assert result["all_passed"] == all(r["passed"] for r in result["rows"])
    assert t["plan"]["micro_batch"] == 4 and t["out_of_memory_at_micro_batch"] == []
    assert result["environment"]["device"] == "cpu"
    assert all(math.isfinite(x) for x in _numbers(result))


def _module_level_imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module, names) of the imports that run when the module is imported: not those inside functions."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module, [a.name for a in node.names]))
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
    return found


def _loaded_on_import(start: str) -> set[str]:
    """The top-level packages that importing ``start`` loads through the project's modules."""
    def path(module):
        base = REPO.joinpath(*module.split("."))
        return next((p for p in (base / "__init__.py", base.with_suffix(".py")) if p.is_file()), None)

    seen, outside, todo = set(), set(), [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages' __init__ run first
        for name, names in _module_level_imports(ast.parse(path(module).read_text())):
            if path(name) is None:
                outside.add(name.split(".")[0])
                continue
            todo.append(name)
            todo += [f"{name}.{n}" for n in names if path(f"{name}.{n}") is not None]
    return outside


def test_the_script_loads_neither_deepspeed_nor_the_web_stack():
    loaded = _loaded_on_import("bench.trainer.gpu_check")
    assert {"torch", "numpy"} <= loaded  # the walk sees the script's own imports
    assert "deepspeed" in _loaded_on_import("trainer.engine.deepspeed.engine")  # and would see DeepSpeed's
    assert not loaded & {"deepspeed", "django", "celery", "webapp", "workers"}
