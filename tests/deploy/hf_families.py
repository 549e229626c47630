"""Tiny random models of each Hugging Face family the import and export speak, made by transformers itself and saved
with save_pretrained, with a small byte-level BPE tokenizer made by the tokenizers library (and, for the Llama-style
families, its tokenizer_config.json with a chat template), as a hub folder holds them."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MixtralConfig,
                          MixtralForCausalLM, PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM)

from trainer.contract.presets import demo_text
from trainer.data.tokenizer import EOS

VOCAB = 300  # 256 bytes, the special tokens, the rest merges
BOS, END = "<|begin_of_text|>", "<|end_of_text|>"
CHAT_TEMPLATE = ("{% for m in messages %}<|begin_of_text|>{{ m['role'] }}: {{ m['content'] }}<|end_of_text|>"
                 "{% endfor %}{% if add_generation_prompt %}<|begin_of_text|>assistant: {% endif %}")
FAMILIES = ("gpt2", "llama", "qwen2", "mixtral", "qwen2_moe")
_ATTENTION = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  vocab_size=VOCAB, initializer_range=0.2)


def hf_model(family: str) -> PreTrainedModel:
    """A random model of ``family`` with weights large enough for logits far apart (greedy decoding without
    near-ties) and norms and biases that are not a fresh model's ones and zeros (a swapped tensor would show)."""
    torch.manual_seed(0)
    if family == "gpt2":
        # eps 1e-6, not the LayerNorm default: the import must carry it
        config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB, initializer_range=0.3,
                            layer_norm_epsilon=1e-6)
        model = GPT2LMHeadModel(config)
    elif family == "llama":
        # Llama 3.1's rope scaling, over positions the test reaches (original context 32 of 128)
        config = LlamaConfig(**_ATTENTION, intermediate_size=96, num_hidden_layers=2, rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                             rms_norm_eps=1e-5)
        model = LlamaForCausalLM(config)
    elif family == "qwen2":
        config = Qwen2Config(**_ATTENTION, intermediate_size=96, num_hidden_layers=2, tie_word_embeddings=True)
        model = Qwen2ForCausalLM(config)
    elif family == "mixtral":
        config = MixtralConfig(**_ATTENTION, intermediate_size=96, num_hidden_layers=2, num_local_experts=4,
                               num_experts_per_tok=2)
        model = MixtralForCausalLM(config)
    elif family == "qwen2_moe":
        # the first layer dense (mlp_only_layers), top-2 of 4 experts without renormalising, a gated shared expert
        config = Qwen2MoeConfig(**_ATTENTION, intermediate_size=96, moe_intermediate_size=48,
                                shared_expert_intermediate_size=80, num_hidden_layers=3, num_experts=4,
                                num_experts_per_tok=2, mlp_only_layers=[0], norm_topk_prob=False)
        model = Qwen2MoeForCausalLM(config)
    else:
        raise ValueError(family)
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def save_family(family: str, model: PreTrainedModel, folder: Path, **save_kwargs) -> Path:
    """``model`` saved to ``folder`` with its tokenizer: GPT-2's vocab.json + merges.txt, the others a tokenizer.json
    and tokenizer_config.json (with a chat template) as PreTrainedTokenizerFast.save_pretrained writes them."""
    model.save_pretrained(folder, **save_kwargs)
    text = demo_text(8_000).decode()
    if family == "gpt2":
        bpe = ByteLevelBPETokenizer(add_prefix_space=False)
        bpe.train_from_iterator([text], vocab_size=VOCAB, min_frequency=2, special_tokens=[EOS], show_progress=False)
        bpe.save_model(str(folder))
        return folder
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    # <|endoftext|> too, as Qwen2's vocabulary has it: transformers' Qwen2 tokenizer adds it where it is missing
    bpe.train_from_iterator([text], vocab_size=VOCAB, min_frequency=2, special_tokens=[BOS, END, EOS],
                            show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=BOS, eos_token=END,
                                        model_max_length=model.config.max_position_embeddings)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    _set_token_ids(folder, tokenizer.convert_tokens_to_ids(BOS), tokenizer.convert_tokens_to_ids(END))
    return folder


def _set_token_ids(folder: Path, bos: int, eos: int) -> None:
    """The model's config.json and generation_config.json name the tokenizer's bos and eos, as a hub model's do."""
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        if path.is_file():
            path.write_text(json.dumps({**json.loads(path.read_text()), "bos_token_id": bos, "eos_token_id": eos}))
