"""The native GPT as a DeepSpeed PipelineModule, for plans with pp > 1 on the deepspeed engine (ZeRO 0 or 1).

Layers in order: embedding, the L blocks, the final norm (LayerNorm or RMSNorm, as the spec says), the LM head.
``partition_method="type:PipeBlock"`` gives each of the pp stages L/pp blocks; the embedding rides on the first stage
and norm and head on the last.
A tied head is DeepSpeed's TiedLayerSpec: both ends build the embedding, and DeepSpeed all-reduces the tied
weight's gradient between the two stages after backward (the sum of the lookup's and the head's gradients).
Each layer initialises its parameters with ``trainer.model.initial_value`` under the native names, so the pipeline
starts from the very model the native engine starts from; trainer.checkpoint.deepspeed_format maps DeepSpeed's
per-layer checkpoint names back for consolidation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn

from trainer.contract import ModelSpec
from trainer.model import Block, Embedding, initial_value


def _init(module: nn.Module, spec: ModelSpec, prefix: str, seed: int) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(initial_value(spec, prefix + name, tuple(p.shape), seed))


class PipeEmbed(Embedding):
    def __init__(self, spec: ModelSpec, seed: int):
        super().__init__(spec)
        _init(self, spec, "embed.", seed)


class PipeBlock(Block):
    def __init__(self, spec: ModelSpec, layer: int, seed: int):
        super().__init__(spec, layer)
        _init(self, spec, f"layers.{layer}.", seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class PipeNorm(nn.LayerNorm):
    def __init__(self, spec: ModelSpec, seed: int):
        super().__init__(spec.d_model, eps=spec.norm_eps, bias=spec.has_norm_bias)
        _init(self, spec, "norm.", seed)


class PipeRMSNorm(nn.RMSNorm):
    """The final norm of a model with RMSNorm (Llama and its kin); a class of its own, as LayerSpec builds one."""

    def __init__(self, spec: ModelSpec, seed: int):
        super().__init__(spec.d_model, eps=spec.norm_eps)
        _init(self, spec, "norm.", seed)


class PipeHead(nn.Linear):
    def __init__(self, spec: ModelSpec, seed: int):
        super().__init__(spec.d_model, spec.vocab_size, bias=False)
        _init(self, spec, "head.", seed)


def _tied_head(embed: PipeEmbed, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, embed.tokens.weight)  # logits = x Eᵀ with the embedding table E (V × C)


def build_pipeline(spec: ModelSpec, pp: int, seed: int, loss_fn, activation_checkpointing: str):
    layers: list = []
    if spec.tied_embeddings:
        layers.append(TiedLayerSpec("embed", PipeEmbed, spec, seed, tied_weight_attr="tokens.weight"))
    else:
        layers.append(LayerSpec(PipeEmbed, spec, seed))
    layers += [LayerSpec(PipeBlock, spec, i, seed) for i in range(spec.n_layers)]
    layers.append(LayerSpec(PipeRMSNorm if spec.norm == "rmsnorm" else PipeNorm, spec, seed))
    if spec.tied_embeddings:
        layers.append(TiedLayerSpec("embed", PipeEmbed, spec, seed, forward_fn=_tied_head,
                                    tied_weight_attr="tokens.weight"))
    else:
        layers.append(LayerSpec(PipeHead, spec, seed))
    # Only blocks are recomputed: the first layer takes integer token ids, which reentrant recompute cannot take.
    interval = 1 if activation_checkpointing == "full" else 0
    return PipelineModule(layers=layers, num_stages=pp, loss_fn=loss_fn, partition_method="type:PipeBlock",
                          activation_checkpoint_interval=interval, checkpointable_layers=["PipeBlock"])
