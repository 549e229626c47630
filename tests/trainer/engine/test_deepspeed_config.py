"""The DeepSpeed config is a pure function of the run spec; plans DeepSpeed cannot run are refused before launch."""
import json
import subprocess

from tests.trainer.launch import PYTHON, REPO, _env, tiny_spec
from trainer.engine.deepspeed.config import deepspeed_config
from trainer.contract import DatasetSpec, SpecError, check_plan, presets


def _spec(tmp_path, **kw):
    return tiny_spec(tmp_path / "run", DatasetSpec(path="text.txt"), 10, engine="deepspeed", **kw)


def test_it_makes_the_deepspeed_config_from_the_plan(tmp_path):
    # GPUs: DeepSpeed on CPU ranks has no fp16, and the config is the same function of the plan either way
    cfg = deepspeed_config(_spec(tmp_path, dp=2, micro_batch=1, global_batch=8, zero_stage=3, precision="fp16",
                                 offload_optimizer=True, offload_params=True, activation_checkpointing="full",
                                 cluster=presets.cluster("H100-SXM", gpus_per_node=2)))
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) \
        == (8, 1, 4)
    assert cfg["gradient_clipping"] == 1.0
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
    assert cfg["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 2000,
                           "hysteresis": 1, "min_loss_scale": 1}
    assert cfg["activation_checkpointing"]["partition_activations"] is True
    assert cfg["zero_force_ds_cpu_optimizer"] is False  # the client AdamW runs on the offloaded partitions
    json.dumps(cfg)


def test_it_leaves_out_what_the_plan_does_not_ask_for(tmp_path):
    cfg = deepspeed_config(_spec(tmp_path, zero_stage=1))
    assert "fp16" not in cfg and "bf16" not in cfg and "activation_checkpointing" not in cfg
    assert "offload_optimizer" not in cfg["zero_optimization"]
    assert deepspeed_config(_spec(tmp_path, precision="bf16"))["bf16"] == {"enabled": True}


def test_it_refuses_deepspeed_moe_with_zero3_before_launch(tmp_path):
    from trainer.contract.presets import MODELS

    spec = _spec(tmp_path, dp=2)
    spec = spec.replace(model=MODELS["tiny-moe"], plan=spec.plan.replace(zero_stage=3, ep=2))
    assert "ZeRO stage 3" in " ".join(check_plan(spec.model, spec.plan)["zero_stage"])
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    done = subprocess.run([PYTHON, "-m", "trainer", "--spec", str(path)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "mixture of experts does not support ZeRO stage 3" in done.stderr
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "failed" and "ZeRO stage 3" in events[-1]["error"]


def test_it_refuses_pipeline_with_zero2_in_the_spec(tmp_path):
    try:
        _spec(tmp_path, pp=2, zero_stage=2)
    except SpecError as exc:
        assert "pipeline engine runs here with ZeRO stage 1 only" in str(exc)
    else:
        raise AssertionError("pp=2 with ZeRO-2 was accepted")
