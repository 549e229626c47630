"""A GPT: token embedding (+ learned or rotary positions), pre-norm blocks, final norm, LM head. The spec's
choices make it a GPT-2 (LayerNorm, GELU MLP, learned positions, biases) or a Llama (RMSNorm, SwiGLU MLP, rotary
positions with Llama 3.1's scaling, no biases), dense or with experts (Mixtral, Qwen2-MoE: trainer.model.moe).

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

from trainer.contract import ModelSpec, RopeScaling
from trainer.model.moe import MoE


def rotary_frequencies(head_dim: int, base: float, scaling: Optional[RopeScaling] = None,
                       device: torch.device | str | None = None) -> torch.Tensor:
    """θ_i = base^(−2i/D) for i < D/2, fp32; with ``scaling`` (Llama 3.1, rope type "llama3") the wavelengths
    2π/θ_i longer than original_max_positions / low_freq_factor are stretched ``factor`` times, those shorter than
    original_max_positions / high_freq_factor kept, and those between blended linearly in original_max / wavelength,
    so the model reads contexts ``factor`` times longer than it was pre-trained on without moving its local
    frequencies."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    if scaling is None:
        return inv_freq
    wavelength = 2 * math.pi / inv_freq
    old = scaling.original_max_positions
    # 1 at the short-wavelength end (kept), 0 at the long end (divided by factor), linear in old / wavelength between
    keep = ((old / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor))
    blended = (1 - keep) * inv_freq / scaling.factor + keep * inv_freq
    scaled = torch.where(wavelength > old / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq)
    between = (wavelength >= old / scaling.high_freq_factor) & (wavelength <= old / scaling.low_freq_factor)
    return torch.where(between, blended, scaled)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021): rotate each pair (x[2i], x[2i+1]) of q and k by angle t·θ_i,
    θ_i = base^(−2i/D) (``rotary_frequencies``), so q·k depends on the distance between positions only. No
    parameters. Pairs are adjacent (interleaved), not the halves (x[i], x[i+D/2]) Hugging Face's Llama rotates:
    importing such a model permutes the rows of its q and k projections instead (deploy.hf_import)."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, scaling: Optional[RopeScaling] = None):
        super().__init__()
        self.head_dim, self.max_len, self.base, self.scaling = head_dim, max_len, base, scaling
        # Not persistent: derived from the shape, so checkpoints stay free of it.
        self.register_buffer("cos", torch.empty(max_len, head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(max_len, head_dim // 2), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """(Re)compute the tables, e.g. after a model built on the meta device is given real memory."""
        if self.cos.is_meta:
            return
        device = self.cos.device
        inv_freq = rotary_frequencies(self.head_dim, self.base, self.scaling, device)
        angles = torch.outer(torch.arange(self.max_len, dtype=torch.float32, device=device), inv_freq)  # (max_len, D/2)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def forward(self, x: torch.Tensor, start: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x (B, heads, T, D) at positions start … start+T−1, or at ``positions`` (T,) or (B, T) when given (a
        context-parallel rank's rows are not contiguous)."""
        if positions is None:
            T = x.size(-2)
            cos, sin = self.cos[start:start + T], self.sin[start:start + T]  # (T, D/2)
        else:
            cos, sin = self.cos[positions], self.sin[positions]  # (T, D/2) or (B, T, D/2)
            if positions.dim() == 2:
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, D/2): the same for every head
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
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
        qkv_bias = spec.has_qkv_bias  # Qwen2 has q/k/v biases but none on the output projection
        self.q = nn.Linear(C, spec.n_heads * D, bias=qkv_bias)
        self.k = nn.Linear(C, spec.kv_heads * D, bias=qkv_bias)
        self.v = nn.Linear(C, spec.kv_heads * D, bias=qkv_bias)
        self.out = nn.Linear(spec.n_heads * D, C, bias=spec.has_attention_out_bias)
        self.rotary = Rotary(D, spec.seq_len, spec.rope_base, spec.rope_scaling) if spec.positions == "rope" else None
        self.dropout = spec.dropout
        self.resid_drop = nn.Dropout(spec.dropout)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0,
               cache: Optional[KVCache] = None, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rotary positions, shared key/value heads, softmax(q kᵀ / √D + causal mask) v: the part of attention
        with no weights, cheap to recompute, whose saved tensors grow with T² (unfused) or with H/K (GQA)."""
        if self.rotary is not None:
            q, k = self.rotary(q, start, positions), self.rotary(k, start, positions)
        if cache is not None:
            k, v = cache.extend(self.layer, k, v)  # (B, K, past + T, D)
        if self.group > 1:
            k = k.repeat_interleave(self.group, dim=1)  # (B, H, T, D)
            v = v.repeat_interleave(self.group, dim=1)
        # With a cache, one new query sees every cached position: no mask needed.
        causal = q.size(2) > 1 and q.size(2) == k.size(2)
        drop = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=causal)

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None,
                positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x (B, T, C) → (B, T, C); ``positions`` (T,) or (B, T): the absolute positions of the rows when they are
        not 0 … T−1 (or after the cache)."""
        B, T, _ = x.shape
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, D); H/t heads under tensor parallel
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        # Arguments only where needed: a checkpoint function or a wrapper may take positional tensors only.
        if cache is not None:
            y = self.attend(q, k, v, cache.length(), cache, positions)
        elif positions is not None:
            y = self.attend(q, k, v, 0, None, positions)
        else:
            y = self.attend(q, k, v)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C)
        return self.resid_drop(self.out(y))


def make_norm(spec: ModelSpec) -> nn.Module:
    """The spec's normalisation over d_model: LayerNorm (with a bias when the spec has biases) or RMSNorm, both with
    a gain named ``weight`` (checkpoints keep their names whichever it is) and ``norm_eps``."""
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
    return nn.LayerNorm(spec.d_model, eps=spec.norm_eps, bias=spec.has_norm_bias)


# ModelSpec.activation → F.gelu's ``approximate``: the exact x·Φ(x), or GPT-2's tanh approximation of it.
_GELU_APPROXIMATION = {"gelu": "none", "gelu_tanh": "tanh"}


class MLP(nn.Module):
    """GELU: x → GELU(x W_up + b) W_down + b, W_up: C × F, W_down: F × C, GELU exact or tanh-approximated;
    SwiGLU (Shazeer 2020, Llama): x → (SiLU(x W_gate) ⊙ x W_up) W_down with W_gate, W_up: C × F.
    F = ``width``: spec.ffn for a dense layer, spec.moe_ffn for a routed expert, spec.shared_expert_ffn for a
    shared one."""

    def __init__(self, spec: ModelSpec, width: int = 0):
        super().__init__()
        width = width or spec.ffn
        bias = spec.has_mlp_bias
        self.gated = spec.is_gated
        self.gate = nn.Linear(spec.d_model, width, bias=bias) if self.gated else None
        self.up = nn.Linear(spec.d_model, width, bias=bias)
        self.down = nn.Linear(width, spec.d_model, bias=bias)
        self.drop = nn.Dropout(spec.dropout)
        self.approximate = _GELU_APPROXIMATION.get(spec.activation, "none")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            hidden = F.silu(self.gate(x)) * self.up(x)
        else:
            hidden = F.gelu(self.up(x), approximate=self.approximate)
        return self.drop(self.down(hidden))


class Block(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(x)): pre-normalisation keeps the residual stream unnormalised (GPT-2)."""

    def __init__(self, spec: ModelSpec, layer: int):
        super().__init__()
        self.ln1 = make_norm(spec)
        self.attn = Attention(spec, layer)
        self.ln2 = make_norm(spec)
        # Layers past the first_dense_layers, every moe_every-th, route tokens to experts (trainer.model.moe); the
        # others keep one dense MLP.
        if spec.is_moe_layer(layer):
            shared = (lambda: MLP(spec, spec.shared_expert_ffn)) if spec.shared_expert_ffn else None
            self.mlp = MoE(spec, lambda: MLP(spec, spec.moe_ffn), shared)
        else:
            self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None,
                positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        # positions by keyword: tensor parallel's input hook on attn lays out the positional arguments only
        x = x + self.attn(self.ln1(x), cache, positions=positions)
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    """Token ids → vectors: token embedding plus learned positions (none with rotary positions), then dropout."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tokens = nn.Embedding(spec.vocab_size, spec.d_model)
        self.positions = nn.Embedding(spec.seq_len, spec.d_model) if spec.positions == "learned" else None
        self.drop = nn.Dropout(spec.dropout)

    def forward(self, idx: torch.Tensor, start: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """idx (B, T) at positions start … start+T−1, or at ``positions`` (T,) or (B, T) when given."""
        x = self.tokens(idx)  # (B, T, C)
        if self.positions is not None:
            pos = torch.arange(start, start + idx.size(1), device=idx.device) if positions is None else positions
            x = x + self.positions(pos)  # (T, C) broadcast over B, or (B, T, C)
        return self.drop(x)


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed: Optional[Embedding] = Embedding(spec)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.n_layers)})
        self.norm: Optional[nn.Module] = make_norm(spec)
        self.head: Optional[nn.Linear] = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.head.weight = self.embed.tokens.weight  # one V × C matrix reads tokens in and scores them out

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None,
                positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Token ids (B, T) → logits (B, T, V); on a pipeline stage, whatever its first and last parts make of it.
        ``positions`` (T,) or (B, T): the rows' absolute positions when they are not 0 … T−1 (context parallel)."""
        if self.embed is not None:
            x = self.embed(x, cache.length() if cache is not None else 0, positions)  # (B, T, C)
        for block in self.layers.values():
            # Only the input when that is all there is: a checkpoint function may take tensors only.
            x = block(x) if cache is None and positions is None else block(x, cache, positions)
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
    """The full initial tensor of parameter ``name``: N(0, 0.02) for matrices and embeddings (q, k, v, the MLPs'
    gate and up, routers, the shared expert's gate), zeros for biases, ones for the gains of LayerNorm and RMSNorm
    (ln1, ln2, norm); the projections back into the residual stream (attn.out, every MLP's down, experts' and the
    shared expert's included) get 0.02/√(2L) (GPT-2), so the
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
