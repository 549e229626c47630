"""What a reduction costs on a model trained on Shakespeare: int8 keeps validation perplexity within 2 % of fp32,
bf16 and fp16 within 1 %; the validation tokens are found from the checkpoint's manifest alone."""
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from deploy.quality import reduction_report, validation_perplexity, validation_tokens_for
from deploy.reduce import reduce_state
from trainer.checkpoint.consolidated import checkpoint_state, empty_model
from trainer.contract.manifest import read_manifest
from trainer.data import load_tokens, unigram_entropy


@pytest.fixture(scope="module")
def trained(shakespeare_checkpoint):
    """(weights, model spec, validation tokens) of the Shakespeare checkpoint."""
    manifest = read_manifest(shakespeare_checkpoint)
    return checkpoint_state(shakespeare_checkpoint), manifest.model_spec(), validation_tokens_for(manifest)


def test_it_keeps_int8_validation_perplexity_within_2_percent_of_fp32(trained):
    state, spec, val = trained
    report = reduction_report(state, reduce_state(state, "int8"), "int8", spec, val)
    unigram = math.exp(unigram_entropy(val))
    assert report["perplexity_fp32"] < unigram / 4, f"the model has not learned: {report}, unigram {unigram:.1f}"
    assert abs(report["perplexity_change"]) < 0.02, report
    assert report["ratio"] > 3.5, report
    json.dumps(report)


@pytest.mark.parametrize("reduction", ["bf16", "fp16"])
def test_it_keeps_half_precision_perplexity_within_1_percent_of_fp32(trained, reduction):
    state, spec, val = trained
    report = reduction_report(state, reduce_state(state, reduction), reduction, spec, val)
    assert abs(report["perplexity_change"]) < 0.01, report
    assert report["ratio"] == 2.0, report


def test_it_reports_sizes_without_perplexity_when_there_are_no_validation_tokens(trained):
    state, spec, _ = trained
    report = reduction_report(state, reduce_state(state, "int8"), "int8", spec, None)
    assert report["bytes"] * report["ratio"] == report["bytes_fp32"]
    assert report["perplexity"] is report["perplexity_fp32"] is report["perplexity_change"] is None


def test_it_measures_the_same_perplexity_on_every_call(trained):
    state, spec, val = trained
    model = empty_model(spec)
    model.load_state_dict(state)
    model.train()
    first = validation_perplexity(model, val, spec.seq_len)
    assert validation_perplexity(model, val, spec.seq_len) == first and model.training


def test_it_finds_the_validation_tokens_of_the_checkpoint(shakespeare_checkpoint):
    manifest = read_manifest(shakespeare_checkpoint)
    prepared = manifest.tokenizer.rsplit("/", 1)[0]
    found = validation_tokens_for(manifest)
    expected = load_tokens(f"{prepared}/val.bin")
    assert found is not None and len(found) > 1000 and np.array_equal(found, expected)


def test_it_finds_no_validation_tokens_when_the_dataset_is_gone(shakespeare_checkpoint, tmp_path):
    moved = replace(read_manifest(shakespeare_checkpoint), tokenizer=str(tmp_path / "tokenizer.json"))
    assert validation_tokens_for(moved) is None
