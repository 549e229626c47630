"""The serving prediction on this machine: the engine computes on the cores less the one a CPU server keeps, the
kernels are timed with those threads and each shape once (timed again, the median of the timings), their figures
add up as the planner's tree says, the last-level cache is read from what the kernel reports, the probe spans the
levels asked, and the streams a probe's tokens saw decoding at once are read from the client's records and fit the
cost of a token. How fast the kernels are is measured by ``python -m bench.deploy.serving``, not asserted here."""
from __future__ import annotations

import json

import pytest
import torch

from bench.deploy.aiperf_client import decoding_streams
from bench.deploy.predict import TimedKernels, largest_cache_bytes, probe_spec, probe_streams
from deploy.serving.tensor_parallel import cpu_threads
from trainer.contract.presets import MODELS
from trainer.planner.estimate.gemms import Gemm
from trainer.planner.estimate.serving import (HostCosts, Load, Rates, fit_host_costs, iteration_device,
                                              serving_estimate)


@pytest.mark.parametrize("processes, cores, threads", [(1, 2, 1), (1, 16, 15), (2, 16, 7), (4, 2, 1), (1, 1, 1)])
def test_a_cpu_server_keeps_a_core_for_the_server_and_shares_the_rest_among_its_processes(processes, cores,
                                                                                            threads):
    assert cpu_threads(processes, cores) == threads


@pytest.fixture(scope="module")
def kernels():
    return TimedKernels(threads=1, buffer_bytes=8 * 2**20, rounds=1)


def test_a_kernel_is_timed_with_the_engines_threads_and_the_callers_are_given_back(kernels):
    seen = []
    original = torch.set_num_threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads = lambda n: (seen.append(n), original(n))[1]
        kernels.gemm(Gemm("up", 3, 96, 32), 4)
    finally:
        torch.set_num_threads = original
    assert seen == [1, before] and torch.get_num_threads() == before


def test_each_shape_is_timed_once_and_experts_multiply_one_products_time(kernels):
    one = kernels.gemm(Gemm("up", 2, 64, 32), 4)
    assert one.value > 0
    assert kernels.gemm(Gemm("down", 2, 64, 32), 4).value == one.value  # the shape, not the name, is timed
    assert kernels.gemm(Gemm("experts", 2, 64, 32, count=3), 4).value == 3 * one.value


def test_timed_again_each_kernel_takes_the_median_of_its_timings():
    kernels = TimedKernels(threads=1, buffer_bytes=2**20, rounds=1)
    g = Gemm("up", 1, 64, 32)
    first = kernels.gemm(g, 4).value
    kernels.time_again()
    kernels.time_again()
    (timings,) = kernels._seconds.values()
    assert len(timings) == 3 and timings[0] == first
    assert kernels.gemm(g, 4).value == sorted(timings)[1]


def test_a_decode_steps_device_time_is_its_timed_gemms_and_each_layers_attention(kernels):
    model = probe_spec(MODELS["tiny-llama"])
    step = iteration_device(model, kernels, Load(2, 8, 8), 2)
    for part in (step.terms["decode"], step.terms["prefill"]):
        gemms, attention = part.terms["gemms"], part.terms["attention"]
        assert part.value == pytest.approx(gemms.value + model.n_layers * attention.value, rel=1e-12)
        assert gemms.value == pytest.approx(sum(g.value for g in gemms.terms.values()), rel=1e-12)
        for g in gemms.terms.values():
            kernel = g.terms["kernel"]
            assert g.value == pytest.approx(g.terms["layers"] * kernel.value, rel=1e-12)
            assert kernel.value == pytest.approx(kernel.terms["count"] * kernel.terms["timed"], rel=1e-12)
    # the prompt's attention is causal over its own 8 tokens; the decode step's reads the cache of each stream
    assert step.terms["prefill"].terms["attention"].value != step.terms["decode"].terms["attention"].value


def test_the_last_level_cache_is_the_largest_the_kernel_reports(tmp_path):
    for index, size in enumerate(("48K", "1280K", "32768K")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert largest_cache_bytes(tmp_path) == 32 * 2**20
    assert largest_cache_bytes(tmp_path / "none") == 0


def _record(start_ms: float, first_ms: float, end_ms: float, phase: str = "profiling") -> str:
    return json.dumps({"metadata": {"benchmark_phase": phase, "request_start_ns": int(start_ms * 1e6),
                                    "request_end_ns": int(end_ms * 1e6)},
                       "metrics": {"time_to_first_token": {"value": first_ms, "unit": "ms"}}})


def test_the_probe_spans_every_level_asked_from_one_stream_to_the_most_and_at_least_sixteen():
    assert probe_streams([1, 8, 32]) == (1, 32)
    assert probe_streams([64]) == (1, 64)
    assert probe_streams([2]) == probe_streams([1, 8]) == (1, 16)


def test_the_streams_decoding_at_once_are_those_each_token_saw(tmp_path):
    records = tmp_path / "profile_export.jsonl"
    # two streams decode together for 100 ms, then one alone for 100 ms: the tokens of 300 stream-ms saw 2, 2 and 1
    records.write_text("\n".join([_record(0, 10, 110), _record(0, 10, 210), _record(-500, 1, 900, "warmup")]))
    assert decoding_streams(records) == pytest.approx((2 * 200 + 1 * 100) / 300)
    assert decoding_streams(tmp_path / "none.jsonl") == 0.0


def test_a_probe_that_decoded_fewer_streams_than_sent_gives_each_token_its_own_cost():
    # kernels whose times grow with the streams, as the device's do (timed ones, each shape once on a loaded machine,
    # need not: the check below then compares noise)
    kernels = Rates(flop_rate=5e10, bandwidth=1e10)
    probe, load = probe_spec(MODELS["tiny-llama"]), Load(1, 8, 8)
    host = HostCosts(step_s=1e-3, token_s=4e-4, request_s=5e-3)

    def measured(decoding):  # what the client sees when only ``decoding`` of the streams sent are decoding
        figures = serving_estimate(probe, kernels, host, Load(decoding, 8, 8))
        return figures["time_per_output_token"].value, figures["time_to_first_token"].value

    one, twelve = measured(1), measured(12)
    sent_16 = [(1, *one), (16, *twelve)]
    assert fit_host_costs(probe, kernels, load, sent_16, decoding=12).token_s == pytest.approx(4e-4, rel=1e-9)
    assert fit_host_costs(probe, kernels, load, sent_16).token_s < 0.8 * 4e-4  # as if all 16 had decoded
