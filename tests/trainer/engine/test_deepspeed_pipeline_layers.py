"""The DeepSpeed pipeline's layers, laid end to end, are the native model: same initial weights under the same
names, same logits, for each family's final norm (LayerNorm, RMSNorm) and head (tied, untied)."""
import pytest
import torch

from trainer.contract.presets import MODELS
from trainer.engine.deepspeed.pipeline import PipeBlock, PipeEmbed, PipeHead, PipeNorm, PipeRMSNorm, _tied_head
from trainer.model import build_model

SEED = 5


@pytest.mark.parametrize("name, norm", [("tiny", PipeNorm), ("tiny-llama", PipeRMSNorm)])
def test_the_pipeline_layers_in_order_give_the_native_models_logits(name, norm):
    spec = MODELS[name]
    embed = PipeEmbed(spec, SEED)
    blocks = [PipeBlock(spec, i, SEED) for i in range(spec.n_layers)]
    final = (PipeRMSNorm if spec.norm == "rmsnorm" else PipeNorm)(spec, SEED)
    assert type(final) is norm
    head = (lambda x: _tied_head(embed, x)) if spec.tied_embeddings else PipeHead(spec, SEED)
    idx = torch.randint(0, spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    x = embed(idx)
    for block in blocks:
        x = block(x)
    with torch.no_grad():
        assert torch.equal(head(final(x)), build_model(spec, SEED)(idx))
