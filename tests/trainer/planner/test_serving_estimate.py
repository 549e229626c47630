"""The serving prediction: a decode step's GEMMs read every weight once and sample one row a sequence, an MoE step
reaches the experts its tokens choose, its host costs are solved back exactly from measurements it would have made,
its figures stay under the memory-bandwidth bound of a decode step, batching pays off only while the device is
memory-bound, and a load it cannot serve is refused with the reason."""
from __future__ import annotations

import pytest

from trainer.contract import SpecError
from trainer.contract.presets import MODELS, cluster
from trainer.planner.estimate import inference_estimate
from trainer.planner.estimate.gemms import serving_gemms
from trainer.planner.estimate.params import count
from trainer.planner.estimate.serving import HostCosts, Load, Rates, fit_host_costs, serving_estimate

CPU = Rates(flop_rate=60e9, bandwidth=8e9)


def measurement(model, rates, host, load):
    figures = serving_estimate(model, rates, host, load)
    return load.streams, figures["time_per_output_token"].value, figures["time_to_first_token"].value


@pytest.mark.parametrize("name", ["gpt2-small", "llama3-8b", "mixtral-8x7b", "qwen1.5-moe-a2.7b"])
def test_a_decode_step_of_one_stream_multiplies_every_weight_a_token_uses_once(name):
    model = MODELS[name]
    gemms = serving_gemms(model, tokens=1, sequences=1)
    assert sum(g.n * g.k * g.count * layers for g, layers in gemms) == count(model).matmul_per_token
    assert all(g.m == 1 for g, _ in gemms)


def test_a_prompt_samples_only_its_last_token_and_many_tokens_reach_every_expert():
    model = MODELS["mixtral-8x7b"]  # 8 experts, top 2
    gemms = {g.name: g for g, _ in serving_gemms(model, tokens=40, sequences=1)}
    assert gemms["moe_q"].m == 40 and gemms["head"].m == 1
    assert gemms["moe_expert.up"].count == 8 and gemms["moe_expert.up"].m == 10  # 80 choices over 8 experts
    few = {g.name: g for g, _ in serving_gemms(model, tokens=2, sequences=2)}["moe_expert.up"]
    # two tokens' four choices reach 8 · (1 − (6/8)²) = 3.5 experts on average: 4, a row each
    assert (few.count, few.m) == (4, 1)


def test_host_costs_are_solved_back_from_two_measurements_at_one_stream_and_more():
    probe = MODELS["tiny"]
    host = HostCosts(step_s=2.5e-3, token_s=3.1e-4, request_s=7e-3, queue_s=1.3e-3)
    measured = [measurement(probe, CPU, host, Load(s, 16, 32)) for s in (1, 16)]
    fitted = fit_host_costs(probe, CPU, Load(1, 16, 32), measured)
    assert fitted.step_s == pytest.approx(host.step_s, rel=1e-9)
    assert fitted.token_s == pytest.approx(host.token_s, rel=1e-9)
    assert fitted.request_s == pytest.approx(host.request_s, rel=1e-9)
    assert fitted.queue_s == pytest.approx(host.queue_s, rel=1e-9)


def test_a_burst_of_requests_received_one_at_a_time_delays_the_first_tokens_more_with_more_streams():
    model, alone = MODELS["tiny"], HostCosts(step_s=1e-3, token_s=2e-4, request_s=5e-3)
    queued = HostCosts(step_s=1e-3, token_s=2e-4, request_s=5e-3, queue_s=2e-3)
    for s in (1, 8, 32):
        a, q = (serving_estimate(model, CPU, h, Load(s, 16, 32)) for h in (alone, queued))
        extra = q["time_to_first_token"].value - a["time_to_first_token"].value
        assert extra == pytest.approx((s - 1) / 2 * 2e-3, rel=1e-9)
        assert q["time_per_output_token"].value == a["time_per_output_token"].value
        assert q["tokens_per_s"].value <= a["tokens_per_s"].value


def test_a_fit_needs_one_stream_and_a_second_level():
    with pytest.raises(ValueError, match="at 1 stream and at more"):
        fit_host_costs(MODELS["tiny"], CPU, Load(1, 40, 128), [(2, 0.01, 0.02), (4, 0.02, 0.03)])


def test_without_host_costs_one_stream_stays_under_the_decode_bound():
    model, h100 = MODELS["gpt2-small"], cluster("H100-SXM", 1)
    rates = Rates(flop_rate=h100.gpu.peak_tflops * 1e12, bandwidth=h100.gpu.memory_bandwidth_gbs * 1e9)
    load = Load(1, 100, 200)
    served = serving_estimate(model, rates, HostCosts(0, 0, 0), load, precision="bf16")
    bound = inference_estimate(model, h100, batch=1, context=load.prompt_tokens + load.new_tokens // 2)
    assert served["tokens_per_s"].value <= bound["decode_tokens_per_s"].value
    # and not far under it: the prompt's prefill and the first token are all that is added
    assert served["tokens_per_s"].value >= 0.9 * bound["decode_tokens_per_s"].value


def test_streams_multiply_tokens_per_s_while_the_weights_dominate_and_stop_when_arithmetic_does():
    model = MODELS["gpt2-small"]
    host = HostCosts(0, 0, 0)
    memory_bound = Rates(flop_rate=1e15, bandwidth=1e9)
    compute_bound = Rates(flop_rate=1e9, bandwidth=1e15)

    def rate(rates, s):
        return serving_estimate(model, rates, host, Load(s, 40, 128))["tokens_per_s"].value

    assert rate(memory_bound, 8) > 6 * rate(memory_bound, 1)  # less the prompts' and caches' reads
    assert rate(compute_bound, 8) < 1.01 * rate(compute_bound, 1)


def test_a_host_cost_per_token_caps_tokens_per_s_whatever_the_streams():
    host = HostCosts(step_s=0.0, token_s=1e-3, request_s=0.0)
    fast = Rates(flop_rate=1e18, bandwidth=1e18)
    rate = serving_estimate(MODELS["tiny"], fast, host, Load(64, 16, 32))["tokens_per_s"].value
    assert rate < 1000 and rate > 900


def test_a_load_the_context_cannot_hold_is_refused_with_what_to_change():
    model = MODELS["tiny"]
    with pytest.raises(SpecError, match="ask fewer"):
        serving_estimate(model, CPU, HostCosts(0, 0, 0), Load(1, model.seq_len, 8))
    with pytest.raises(SpecError, match="streams"):
        serving_estimate(model, CPU, HostCosts(0, 0, 0), Load(0, 4, 8))
