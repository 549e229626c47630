"""The GPT (``gpt``) and its mixture-of-experts MLP (``moe``): model code only, no parallelism or recomputation.

Parallel plans (``trainer.parallel``) cut, shard and wrap these modules from outside; the names of parameters stay
those of the whole model under every plan, so checkpoints move between plans.
"""
from trainer.model.gpt import (GPT, MLP, Attention, Block, Embedding, KVCache, Rotary, build_model, count_parameters,
                               initial_value, loss_fn, make_norm, rotary_frequencies, tie_weights)
from trainer.model.moe import MoE

__all__ = ["GPT", "MLP", "Attention", "Block", "Embedding", "KVCache", "Rotary", "MoE", "build_model",
           "count_parameters", "initial_value", "loss_fn", "make_norm", "rotary_frequencies", "tie_weights"]
