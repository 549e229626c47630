"""A GPT: token embedding (+ learned or rotary positions), pre-LayerNorm blocks, final LayerNorm, LM head.

Shapes: B batch, T sequence, C = d_model, H heads, K key/value heads (H % K == 0), D = C / H head size, V vocabulary.
The model knows nothing about parallelism or recomputation. Three choices let that code work on it unchanged:
- blocks live in a ModuleDict keyed "0", "1", …, so a pipeline stage can drop the blocks it does not own and
  parameter names (and so checkpoints) stay the same under every plan;
- ``embed``, ``norm`` and ``head`` may be None on a pipeline stage that does not hold them;
- attention reshapes with -1 for the head count, so a tensor-parallel rank holding H/t heads runs the same code.
Initialisation is a pure function of the seed and each parameter's name (``initial_value``): parallel plans build
the model on the meta device, shard or split it, then each rank fills only the shards it holds of the same full
tensors (``initial_tensors``; trainer.parallel.init), so every plan starts from the same weights.
"""
from __future__ import annotations

import math
import zlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from trainer.contract import ModelSpec
from trainer.model.moe import MoE


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021): rotate each pair (x[2i], x[2i+1]) of q and k by angle t·θ_i,
    θ_i = 10000^(−2i/D), so q·k depends on the distance between positions only. No parameters."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.max_len, self.base = head_dim, max_len, base
        # Not persistent: derived from the shape, so checkpoints stay free of it.
        self.register_buffer("cos", torch.empty(max_len, head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(max_len, head_dim // 2), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """(Re)compute the tables, e.g. after a model built on the meta device is given real memory."""
        if self.cos.is_meta:
            return
        device = self.cos.device
        inv_freq = 1.0 / self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
                                       / self.head_dim)
        angles = torch.outer(torch.arange(self.max_len, dtype=torch.float32, device=device), inv_freq)  # (max_len, D/2)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        # x: (B, heads, T, D)
        T = x.size(-2)
        cos, sin = self.cos[start:start + T].to(x.dtype), self.sin[start:start + T].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class KVCache:
    """Keys and values of past positions per block, for generation: each step appends one position."""

    def __init__(self):
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.offset = 0  # positions already cached; GPT.forward advances it after all blocks have run

    def length(self) -> int:
        return self.offset

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.keys:
            k = torch.cat((self.keys[layer], k), dim=2)
            v = torch.cat((self.values[layer], v), dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    """Causal self-attention with K ≤ H key/value heads (grouped-query attention when K < H)."""

    def __init__(self, spec: ModelSpec, layer: int):
        super().__init__()
        C, D = spec.d_model, spec.head_dim
        self.layer, self.head_dim = layer, D
        self.group = spec.n_heads // spec.kv_heads  # query heads sharing one key/value head
        self.q = nn.Linear(C, spec.n_heads * D, bias=spec.bias)
        self.k = nn.Linear(C, spec.kv_heads * D, bias=spec.bias)
        self.v = nn.Linear(C, spec.kv_heads * D, bias=spec.bias)
        self.out = nn.Linear(spec.n_heads * D, C, bias=spec.bias)
        self.rotary = Rotary(D, spec.seq_len) if spec.positions == "rope" else None
        self.dropout = spec.dropout
        self.resid_drop = nn.Dropout(spec.dropout)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0,
               cache: Optional[KVCache] = None) -> torch.Tensor:
        """Rotary positions, shared key/value heads, softmax(q kᵀ / √D + causal mask) v: the part of attention
        with no weights, cheap to recompute, whose saved tensors grow with T² (unfused) or with H/K (GQA)."""
        if self.rotary is not None:
            q, k = self.rotary(q, start), self.rotary(k, start)
        if cache is not None:
            k, v = cache.extend(self.layer, k, v)  # (B, K, past + T, D)
        if self.group > 1:
            k = k.repeat_interleave(self.group, dim=1)  # (B, H, T, D)
            v = v.repeat_interleave(self.group, dim=1)
        # With a cache, one new query sees every cached position: no mask needed.
        causal = q.size(2) > 1 and q.size(2) == k.size(2)
        drop = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=causal)

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, D); H/t heads under tensor parallel
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        if cache is None:
            y = self.attend(q, k, v)  # (B, H, T, D)
        else:
            y = self.attend(q, k, v, cache.length(), cache)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C)
        return self.resid_drop(self.out(y))


# ModelSpec.activation → F.gelu's ``approximate``: the exact x·Φ(x), or GPT-2's tanh approximation of it.
_GELU_APPROXIMATION = {"gelu": "none", "gelu_tanh": "tanh"}


class MLP(nn.Module):
    """x → GELU(x W1 + b1) W2 + b2 with W1: C × F, W2: F × C; GELU exact or tanh-approximated (spec.activation)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.up = nn.Linear(spec.d_model, spec.ffn, bias=spec.bias)
        self.down = nn.Linear(spec.ffn, spec.d_model, bias=spec.bias)
        self.drop = nn.Dropout(spec.dropout)
        self.approximate = _GELU_APPROXIMATION[spec.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(F.gelu(self.up(x), approximate=self.approximate)))


class Block(nn.Module):
    """x + attn(LN(x)), then + mlp(LN(x)): pre-LayerNorm keeps the residual stream unnormalised (GPT-2)."""

    def __init__(self, spec: ModelSpec, layer: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(spec.d_model, bias=spec.bias)
        self.attn = Attention(spec, layer)
        self.ln2 = nn.LayerNorm(spec.d_model, bias=spec.bias)
        # Every moe_every-th block routes tokens to experts (trainer.model.moe); the others keep one dense MLP.
        self.mlp = MoE(spec, lambda: MLP(spec)) if spec.is_moe_layer(layer) else MLP(spec)

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache)
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    """Token ids → vectors: token embedding plus learned positions (none with rotary positions), then dropout."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tokens = nn.Embedding(spec.vocab_size, spec.d_model)
        self.positions = nn.Embedding(spec.seq_len, spec.d_model) if spec.positions == "learned" else None
        self.drop = nn.Dropout(spec.dropout)

    def forward(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        x = self.tokens(idx)  # (B, T, C)
        if self.positions is not None:
            pos = torch.arange(start, start + idx.size(1), device=idx.device)
            x = x + self.positions(pos)  # (T, C) broadcast over B
        return self.drop(x)


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed: Optional[Embedding] = Embedding(spec)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.n_layers)})
        self.norm: Optional[nn.LayerNorm] = nn.LayerNorm(spec.d_model, bias=spec.bias)
        self.head: Optional[nn.Linear] = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.head.weight = self.embed.tokens.weight  # one V × C matrix reads tokens in and scores them out

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """Token ids (B, T) → logits (B, T, V); on a pipeline stage, whatever its first and last parts make of it."""
        if self.embed is not None:
            x = self.embed(x, cache.length() if cache is not None else 0)  # (B, T, C)
        for block in self.layers.values():
            x = block(x) if cache is None else block(x, cache)
        if cache is not None:
            cache.offset += x.size(1)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)  # (B, T, V)
        return x

    def initial_tensors(self, seed: int) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
        """Each distinct parameter this model (or pipeline stage) holds, with the full initial tensor of its name.
        A sharded model fills each parameter's shards from these (trainer.parallel.init); a whole one copies them."""
        seen: set[int] = set()
        for name, p in self.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name == "head.weight" and self.spec.tied_embeddings:
                name = "embed.tokens.weight"  # a pipeline's last stage holds the tied matrix as the head
            yield p, initial_value(self.spec, name, tuple(p.shape), seed)

    def reset_buffers(self) -> None:
        """Recompute the derived buffers (rotary tables) after the model was given memory."""
        for module in self.modules():
            if isinstance(module, Rotary):
                module.reset_buffers()

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Give every parameter of this whole (unsharded) model its ``initial_value``."""
        for p, full in self.initial_tensors(seed):
            p.copy_(full)
        self.reset_buffers()


def initial_value(spec: ModelSpec, name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full initial tensor of parameter ``name``: N(0, 0.02) for matrices and embeddings, zeros for biases,
    ones for LayerNorm gains; the projections back into the residual stream get 0.02/√(2L) (GPT-2), so the
    stream's variance does not grow with depth. Each parameter draws from its own generator, seeded by the run's
    seed and the parameter's name: a rank can make the parameters it holds without drawing the others'."""
    if name.endswith("bias"):
        return torch.zeros(shape)
    if ".ln" in name or name.startswith("norm"):
        return torch.ones(shape)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63))
    std = 0.02 / math.sqrt(2 * spec.n_layers) if name.endswith(("attn.out.weight", "down.weight")) else 0.02
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def build_model(spec: ModelSpec, seed: int, device: torch.device | str = "cpu") -> GPT:
    """The whole model, initialised from ``seed`` (parallel plans build on the meta device instead, shard, then
    fill their shards: trainer.parallel.init)."""
    with torch.device(device):
        model = GPT(spec)
    model.init_weights(seed)
    return model


def tie_weights(model: GPT) -> None:
    """Re-point a tied head at the embedding after something replaced one of them (sharding, to_empty)."""
    if model.spec.tied_embeddings and model.embed is not None and model.head is not None:
        model.head.weight = model.embed.tokens.weight


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token prediction: logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
