"""Memory as a band: the overheads a GPU holds besides the plan's tensors, named, each a range; "fits" by the high
end; and the model states of each engine's convention, Megatron-LM's distributed optimizer among them."""
import pytest

from trainer.contract import DatasetSpec, ParallelPlan, RunSpec
from trainer.contract.presets import MODELS, cluster
from trainer.planner.estimate import memory as M
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.options import EstimateOptions

PSI, ND = 7_500_000_000, 64   # Ψ divides by d: the shards are exact


@pytest.mark.parametrize("precision,plain,distributed", [
    ("bf16", 18 * PSI, 6 * PSI + 12 * PSI // ND),
    ("fp16", 20 * PSI, 4 * PSI + 16 * PSI // ND),
    ("fp32", 16 * PSI, 8 * PSI + 8 * PSI // ND)])
def test_megatron_states_follow_its_distributed_optimizer_table(precision, plain, distributed):
    def total(stage):
        s = M.model_states(PSI, PSI // ND, ND, stage, precision, "megatron")
        return s["weights"] + s["gradients"] + s["optimizer"]
    assert total(0) == plain and total(1) == distributed


def test_a_megatron_plan_is_estimated_but_refused_for_training_with_the_reason():
    model, clu = MODELS["gpt2-medium"], cluster("A100-SXM-80GB", 8)
    plan = ParallelPlan(dp=8, micro_batch=4, global_batch=64, precision="bf16", engine="megatron", zero_stage=1)
    numbers = Planner(model, clu).evaluate(plan)
    native = Planner(model, clu).evaluate(plan.replace(engine="native", zero_stage=0))
    stage = numbers.stages[0]
    # its 16-bit weights are the stored ones and its gradient buffer is what the all-reduce reads: no autocast
    # copies, no DDP bucket copy
    assert "autocast_weight_copies" not in stage.buffers and "ddp_buckets" not in stage.buffers
    assert "ddp_buckets" in native.stages[0].buffers
    assert stage.states["optimizer"] == 12 * -(-stage.params // 8)
    assert "zero_stage" in plan.replace(zero_stage=2).problems()
    spec = RunSpec(model=model, plan=plan, cluster=clu, dataset=DatasetSpec(path="data.txt"), output_dir="out")
    assert any("engine='native' or 'deepspeed'" in m for m in spec.problems()["plan.engine"])


def test_the_band_names_each_overhead_and_the_high_end_decides_whether_a_plan_fits():
    model = MODELS["gpt2-xl"]
    plan = ParallelPlan(dp=2, micro_batch=8, global_batch=16, precision="bf16")
    planner = Planner(model, cluster("A100-SXM-80GB", 2))
    numbers = planner.evaluate(plan)
    stage = numbers.stages[0]
    assert set(stage.overheads) == {"cuda_context", "driver_reserve", "nccl", "fragmentation"}
    band = stage.band
    tensors = stage.model_state_bytes + stage.activations + sum(stage.buffers.values())
    assert band.low < band.expected < band.high
    assert band.high == pytest.approx(tensors + sum(b.high for b in stage.overheads.values()))
    assert stage.overheads["fragmentation"].high == pytest.approx(
        M.FRAGMENTATION_HIGH * (stage.activations + sum(stage.buffers.values())))
    # the tuner's fast path gives the same ends
    quick = planner.quick(plan)
    assert quick.peak_bytes == pytest.approx(numbers.peak_bytes) and \
        quick.peak_high_bytes == pytest.approx(numbers.peak_band.high)
    # a GPU between the expected peak and the high end: the plan does not fit
    between = (numbers.peak_bytes + numbers.peak_band.high) / 2 / 1e9
    small = cluster("A100-SXM-80GB", 2)
    small = small.replace(gpu=small.gpu.replace(memory_gb=between))
    tight = Planner(model, small).evaluate(plan)
    assert tight.peak_bytes < tight.capacity_bytes < tight.peak_band.high and not tight.fits
    # one process: no NCCL
    alone = Planner(model, cluster("A100-SXM-80GB", 1)).evaluate(plan.replace(dp=1, global_batch=8))
    assert "nccl" not in alone.stages[0].overheads


def test_a_measured_overhead_replaces_the_named_ones_and_the_cpu_has_none():
    model, plan = MODELS["gpt2-medium"], ParallelPlan(dp=2, micro_batch=4, global_batch=8, precision="bf16")
    measured = Planner(model, cluster("A100-SXM-80GB", 2), EstimateOptions(overhead_bytes=2e9)).evaluate(plan)
    assert measured.stages[0].overheads["overhead"] == M.Band.exact(2e9)
    assert set(measured.stages[0].overheads) == {"overhead", "fragmentation"}
    cpu = Planner(model, cluster("cpu", 2)).evaluate(plan.replace(precision="fp32"))
    band = cpu.peak_band
    assert cpu.stages[0].overheads == {} and band.low == band.expected == band.high
