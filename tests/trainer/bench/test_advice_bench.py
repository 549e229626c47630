"""The advice benchmark's pure parts: the variants it trains, its gains and its direction check (the training runs
themselves are the benchmark's, not the suite's)."""
from trainer.bench.advice import BASE, direction, gain, predicted_step_s, variants
from trainer.planner.estimate.flops import model_flops_per_token
from trainer.planner.estimate.params import count


def test_it_compares_equal_parameter_shapes_equal_flop_experts_and_two_micro_batches():
    pairs = variants()
    kinds = [v.comparison for _, v in pairs]
    assert kinds.count("depth vs width") == 2 and "MoE vs dense" in kinds and "micro-batch" in kinds
    for ref, var in pairs:
        assert ref.plan.global_batch * ref.model.seq_len == var.plan.global_batch * var.model.seq_len
        if var.comparison == "depth vs width":
            assert var.model.n_layers != BASE.n_layers
            # widths move in head_dim steps (32 here): the nearest shape is within a fifth of the parameters
            assert abs(count(var.model).total / count(BASE).total - 1) < 0.2
        if var.comparison == "MoE vs dense":
            assert var.model.is_moe and model_flops_per_token(var.model) == model_flops_per_token(ref.model)
        if var.comparison == "micro-batch":
            assert (ref.plan.micro_batch, var.plan.micro_batch) == (1, 8) and ref.model == var.model


def test_its_predictions_are_the_planners_cpu_estimates_and_favour_the_larger_micro_batch():
    (ref, var), = [p for p in variants() if p[1].comparison == "micro-batch"]
    assert gain(predicted_step_s(ref), predicted_step_s(var)) > 0


def test_it_calls_gains_of_one_sign_the_same_direction_and_small_ones_flat():
    assert gain(2.0, 1.0) == 1.0 and gain(1.0, 2.0) == -0.5
    assert direction(0.2, 0.5) == "same" and direction(-0.2, -0.1) == "same"
    assert direction(0.2, -0.5) == "opposite"
    assert direction(0.0, -0.5) == "predicted flat" and direction(0.3, 0.01) == "measured flat"
    assert direction(0.01, -0.02) == "same"
