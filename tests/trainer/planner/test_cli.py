"""The command lines print the breakdown with formulas, JSON, and the tuner's tables."""
import json

from trainer.planner.estimate.__main__ import main as estimate_main
from trainer.planner.tune.__main__ import main as tune_main


def test_it_prints_the_gpt3_breakdown_with_formulas(capsys):
    code = estimate_main(["--model", "gpt3-175b", "--gpu", "A100-SXM-80GB", "--nodes", "128", "--dp", "8",
                          "--tp", "8", "--pp", "16", "--micro-batch", "1", "--global-batch", "1536",
                          "--precision", "bf16", "--sequence-parallel", "--activation-checkpointing", "selective",
                          "--tokens", "3e11", "--inference"])
    out = capsys.readouterr().out
    assert code == 0
    for text in ("174,604.259 M params", "6 · N + 12 · L · h · s", "Memory per GPU, pipeline stage 0", "Peak:",
                 "2 · (t − 1) / t", "mfu", "gpu_hours", "2 · L · n_kv_heads · head_dim · bytes"):
        assert text in out


def test_it_reads_plan_and_model_json_files(tmp_path, capsys):
    from trainer.contract.presets import MODELS
    from trainer.contract import ParallelPlan
    (tmp_path / "model.json").write_text(MODELS["gpt2-small"].to_json())
    (tmp_path / "plan.json").write_text(ParallelPlan(dp=4, tp=2, micro_batch=2, global_batch=32).to_json())
    code = estimate_main(["--model-json", str(tmp_path / "model.json"), "--plan-json", str(tmp_path / "plan.json"),
                          "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["plan"]["tp"] == 2 and data["parameters"]["total"]["value"] == 124_439_808


def test_it_prints_top_plans_rejections_and_the_pareto_front(capsys):
    assert tune_main(["--model", "gpt2-medium", "--nodes", "2", "--global-batch", "64", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "Fastest 5 plans" in out and "Rejected (reason: count)" in out and "Pareto front" in out
    assert tune_main(["--model", "gpt2-medium", "--nodes", "1", "--global-batch", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["top"] and data["pareto"] and data["evaluated"] >= data["fitting"]
