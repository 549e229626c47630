"""A GPT-2 saved by transformers, imported, exported and served by the real Triton, continues a prompt as
transformers' own ``generate`` does."""
from __future__ import annotations

import pytest
import torch

from deploy.client import GenerateParams
from deploy.export import ExportOptions, export
from tests.deploy.test_hf_import import hf_folder, hf_model, imported, tokenizer_files  # noqa: F401  (fixtures)
from trainer.data.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def served_gpt2(triton, imported):  # noqa: F811
    export(imported, triton.repository, ExportOptions(name="gpt2-import", measure=False))
    client = triton.client()
    client.load("gpt2-import")
    yield client
    client.unload("gpt2-import")
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_it_serves_an_imported_gpt2_greedily_as_transformers_generates(served_gpt2, imported, hf_model,  # noqa: F811
                                                                       protocol):
    tokenizer = load_tokenizer(imported / "tokenizer.json")
    for prompt in ("ROMEO:\nWhat say", "First Citizen:"):
        ids = tokenizer.encode(prompt)
        theirs = hf_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=30,
                                   eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id)[0].tolist()
        answer = served_gpt2.generate("gpt2-import", GenerateParams(prompt, max_tokens=30), protocol)
        assert answer.token_ids == theirs[len(ids):]
        assert answer.finish_reason == ("stop" if theirs[-1] == tokenizer.eos_id else "length")
