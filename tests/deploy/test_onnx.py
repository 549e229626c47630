"""The ONNX export: onnxruntime's logits match PyTorch's at more than one batch and sequence length (the axes are
dynamic), for learned positions with a tied head, rotary positions with an untied one, and mixture of experts."""
import pytest
import torch

from deploy.onnx_export import check_onnx, export_onnx
from trainer.contract.presets import MODELS
from trainer.model import Attention, build_model

TOLERANCE = 1e-4
SHAPES = [(1, 7), (3, 64)]  # (batch, sequence): neither is the export's own example
MODELS_EXPORTED = {
    "learned-tied": MODELS["tiny"],
    "rope-untied-gqa": MODELS["tiny"].replace(positions="rope", tied_embeddings=False, n_kv_heads=2),
    "moe": MODELS["tiny-moe"],
}


@pytest.mark.parametrize("name", list(MODELS_EXPORTED))
def test_it_matches_pytorch_logits_at_two_shapes(name, tmp_path):
    spec = MODELS_EXPORTED[name]
    model = build_model(spec, seed=3)
    path = export_onnx(model, tmp_path / f"{name}.onnx")
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        diff = check_onnx(model, path, torch.randint(0, spec.vocab_size, shape, generator=gen))
        assert diff < TOLERANCE, f"{name} at {shape}: max |onnx − torch| = {diff:.2e}"
    # the export leaves the model as it was
    assert model.training and all(type(m.attn) is Attention for m in model.layers.values())


def test_it_refuses_sequences_longer_than_the_model_holds(tmp_path):
    model = build_model(MODELS["tiny"], seed=3)
    with pytest.raises(ValueError, match="seq_len=65"):
        export_onnx(model, tmp_path / "model.onnx", seq_len=65)


def test_it_exports_a_checkpoint_from_the_command_line_and_checks_it(shakespeare_checkpoint, tmp_path, capsys):
    import json

    from deploy.__main__ import main as deploy_main

    assert deploy_main(["onnx", "--checkpoint", str(shakespeare_checkpoint), "--output", str(tmp_path / "m.onnx")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["max_abs_difference"] < 1e-4 and (tmp_path / "m.onnx").stat().st_size == report["bytes"]
