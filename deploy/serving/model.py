"""The GPT as the server runs it: many sequences decoded together over one slot cache.

Shapes: S slots (sequences the engine can hold at once), L = seq_len, B sequences in this call, T prompt length,
C = d_model, H heads and K key/value heads held by this rank, D head size, V vocabulary, t tensor-parallel ranks.

The weights are the trainer's, under its parameter names, possibly int8 per output channel (``<name>_scale``) and
possibly this rank's tensor-parallel shard (``deploy.reshard``). The maths is the trainer's model exactly
(``trainer.model.gpt``); what differs is only how work is laid out for serving:
- every sequence owns a slot of a preallocated key/value cache (S, K, L, D) per layer, and its own length, so one
  call appends new positions to many sequences whatever their lengths: one each (a decode step), whole prompts
  (right-padded to the longest), or chunks of prompts that continue where their slot ends;
- a new position's query sees its slot's positions ≤ its own, masked per row (the others hold another sequence's
  past or nothing); prompts starting at position 0 attend to themselves only, causally;
- a prefix cache of fixed size holds blocks of prompt positions' keys and values, copied into a slot when a new
  prompt starts with the same tokens (``prefix_cache``), so those positions are not computed again;
- tensor parallel (Megatron's split): q, k, v and the MLP's up projection are split by output columns, so a rank
  holds H/t heads and F/t hidden units; the attention output and the MLP's down projection are split by input rows,
  so each rank's product is a partial sum Y = Σ_r X_r A_r that one all-reduce completes (its bias added once, by
  rank 0). Embedding, norms, the router and the head are whole on every rank.
Every family the trainer builds is served: LayerNorm or RMSNorm; a GELU MLP or SwiGLU (gate and up split like up);
rotary positions of any base, with Llama 3.1's scaling; grouped-query attention; biases wherever the weights have
them (q/k/v only, as Qwen2, or everywhere); routed experts, renormalised or not, after dense first layers, and a
shared expert with its sigmoid gate. Which biases and how wide each MLP is are read from the weights; the rest
(norm, activation, rotary frequencies, routing) from the model spec the exporter writes.
It needs torch and this package only: the exporter copies both into the model repository beside the Triton
model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F

from .prefix_cache import PREFIX_BLOCK_SIZE

if TYPE_CHECKING:
    from .scheduler import Plan

SCALE_SUFFIX = "_scale"


@dataclass(frozen=True)
class ServingSpec:
    """The model's shape, from the model spec the exporter writes (the trainer's ModelSpec as JSON): the fields
    serving needs, under the same names and with the same defaults (a spec written before a field existed means
    the default). Widths of the MLPs and which biases exist are not here: the weights say them."""

    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab_size: int
    n_kv_heads: int = 0
    positions: str = "learned"
    tied_embeddings: bool = True
    activation: str = "gelu"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_scaling: Optional[dict] = None  # Llama 3.1: factor, low_freq_factor, high_freq_factor, original_max_positions
    n_experts: int = 0
    top_k: int = 2
    moe_every: int = 1
    first_dense_layers: int = 0
    topk_norm: str = "auto"

    @classmethod
    def from_dict(cls, data: dict) -> "ServingSpec":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def renormalizes_topk(self) -> bool:
        """The chosen experts' weights sum to 1 ("renormalize"; "auto" when k > 1) or stay router probabilities."""
        return self.topk_norm == "renormalize" or (self.topk_norm == "auto" and self.top_k > 1)

    def is_moe_layer(self, index: int) -> bool:
        """Past the first ``first_dense_layers``, every moe_every-th layer counting from 1 (the trainer's rule)."""
        return self.n_experts > 1 and index >= self.first_dense_layers and (index + 1) % self.moe_every == 0


def inverse_frequencies(head_dim: int, base: float, scaling: Optional[dict]) -> torch.Tensor:
    """θ_i = base^(−2i/D) for each rotated pair i, in fp32; with Llama 3.1's scaling, wavelengths 2π/θ longer than
    original_max_positions / low_freq_factor are stretched ``factor`` times, those shorter than
    original_max_positions / high_freq_factor kept, and those between blended linearly in original / wavelength."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if not scaling:
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_positions"]
    wavelength = 2 * math.pi / inv_freq
    smooth = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)  # 0: stretched … 1: kept
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


AllReduce = Callable[[torch.Tensor], None]  # sums a tensor over the tensor-parallel ranks, in place


class Linear:
    """y = x Wᵀ (+ b); W kept as stored: floating, or int8 with one fp32 scale per output row (W ≈ s · q)."""

    def __init__(self, weight: torch.Tensor, scale: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 dtype: torch.dtype):
        self.weight = weight if scale is not None else weight.to(dtype)
        self.scale = scale.to(dtype).unsqueeze(-1) if scale is not None else None
        self.bias = bias.to(dtype) if bias is not None else None

    def matrix(self) -> torch.Tensor:
        if self.scale is None:
            return self.weight
        return self.weight.to(self.scale.dtype) * self.scale  # dequantised for this product only: int8 stays in memory

    def __call__(self, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        return F.linear(x, self.matrix(), self.bias if bias else None)


class Weights:
    """A rank's tensors by native name; int8 ones dequantised on use."""

    def __init__(self, state: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device):
        self.state = {k: v.to(device) for k, v in state.items()}
        self.dtype = dtype

    def has(self, name: str) -> bool:
        return f"{name}.weight" in self.state

    def linear(self, name: str) -> Linear:
        return Linear(self.state[f"{name}.weight"], self.state.get(f"{name}.weight{SCALE_SUFFIX}"),
                      self.state.get(f"{name}.bias"), self.dtype)

    def tensor(self, name: str) -> torch.Tensor:
        return self.linear(name.removesuffix(".weight")).matrix() if name.endswith(".weight") \
            else self.state[name].to(self.dtype)

    def optional(self, name: str) -> Optional[torch.Tensor]:
        return self.tensor(name) if name in self.state else None


class Norm:
    """The block's and the output's normalisation: LayerNorm (its bias if the weights have one) or RMSNorm."""

    def __init__(self, w: Weights, name: str, spec: ServingSpec):
        self.gain, self.bias = w.tensor(f"{name}.weight"), w.optional(f"{name}.bias")
        self.shape, self.eps, self.rms = (spec.d_model,), spec.norm_eps, spec.norm == "rmsnorm"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            return F.rms_norm(x, self.shape, self.gain, self.eps)
        return F.layer_norm(x, self.shape, self.gain, self.bias, self.eps)


class RowParallel:
    """A linear split by input rows across ranks: each computes a partial sum; one all-reduce completes it."""

    def __init__(self, linear: Linear, rank: int, all_reduce: Optional[AllReduce]):
        self.linear, self.first, self.all_reduce = linear, rank == 0, all_reduce

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x, bias=self.first)  # the bias once, not t times
        if self.all_reduce is not None:
            self.all_reduce(y)
        return y


class MLP:
    """GELU: x → GELU(x W_up + b) W_down (+ b); SwiGLU: x → (SiLU(x W_gate) ⊙ x W_up) W_down. Under tensor parallel
    W_gate and W_up are split by columns, W_down by rows (its partial sum reduced by the caller)."""

    def __init__(self, w: Weights, name: str, activation: str, rank: int):
        self.up, self.down, self.first = w.linear(f"{name}.up"), w.linear(f"{name}.down"), rank == 0
        self.gate = w.linear(f"{name}.gate") if activation == "swiglu" else None
        self.approximate = "tanh" if activation == "gelu_tanh" else "none"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            h = F.silu(self.gate(x)) * self.up(x)
        else:
            h = F.gelu(self.up(x), approximate=self.approximate)
        return self.down(h, bias=self.first)


class MoE:
    """Top-k routing that drops nothing (serving computes every chosen expert of every token; the trainer's
    capacity only bounds a training batch): y = Σ_j g_j · expert_{e_j}(x) (+ σ(x w_g) · shared(x)), g the router's
    top-k probabilities, renormalised to sum to 1 or not (topk_norm), and the shared expert, gated when the
    weights have its gate, that every token passes through."""

    def __init__(self, w: Weights, name: str, spec: ServingSpec, rank: int):
        self.router = w.linear(f"{name}.router")
        self.experts = [MLP(w, f"{name}.experts.{e}", spec.activation, rank) for e in range(spec.n_experts)]
        self.shared = MLP(w, f"{name}.shared", spec.activation, rank) if w.has(f"{name}.shared.up") else None
        self.shared_gate = w.linear(f"{name}.shared_gate") if w.has(f"{name}.shared_gate") else None
        self.top_k, self.renormalize = spec.top_k, spec.renormalizes_topk

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # (N, C)
        probs = F.softmax(self.router(tokens).float(), dim=-1)  # (N, E), fp32 as in training
        top_p, top_e = probs.topk(self.top_k, dim=-1)
        gate = (top_p / top_p.sum(-1, keepdim=True) if self.renormalize else top_p).to(tokens.dtype)
        y = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, choice = (top_e == e).nonzero(as_tuple=True)
            if rows.numel():
                y.index_add_(0, rows, expert(tokens[rows]) * gate[rows, choice].unsqueeze(-1))
        if self.shared is not None:
            shared = self.shared(tokens)
            if self.shared_gate is not None:
                shared = shared * torch.sigmoid(self.shared_gate(tokens))  # (N, 1): one gate per token
            y = y + shared
        return y.view(shape)


class SlotCache:
    """Keys and values of every slot's past positions, per layer: (S, K, L, D) each, and each slot's length (kept
    on the host: the engine's bookkeeping, never a reason to wait for the device)."""

    def __init__(self, n_layers: int, slots: int, kv_heads: int, seq_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (slots, kv_heads, seq_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.lengths = [0] * slots


class PrefixBlocks:
    """The prefix cache's memory: N blocks of ``block_size`` positions' keys and values per layer, (N, K, b, D)
    each, allocated once (so the cache is bounded); which prompt prefix a block holds is the engine's bookkeeping
    (``prefix_cache.PrefixCache``)."""

    def __init__(self, n_layers: int, blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (blocks, kv_heads, block_size, head_dim)
        self.block_size = block_size
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers if blocks else 0)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers if blocks else 0)]
        self.count = blocks


def store_step(keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
               k: torch.Tensor, v: torch.Tensor) -> None:
    """A decode step's new keys and values k, v (B, K, D) into the cache (S, K, L, D), row b's into slot slots[b]
    at position positions[b]."""
    keys[slots, :, positions] = k
    values[slots, :, positions] = v


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor], group: int,
           causal: bool) -> torch.Tensor:
    """The attention core: q (B, H, T, D) over keys and values (B, K, L, D), each of the K shared by ``group``
    query heads; ``mask`` (B, 1, T, L) True where a query sees a position, or None."""
    if group > 1:
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal)


def _as_range(slots: torch.Tensor) -> slice | torch.Tensor:
    first, n = int(slots[0]), slots.numel()
    if int(slots[-1]) == first + n - 1 and bool((slots.diff() == 1).all()):
        return slice(first, first + n)
    return slots


class BatchLogits(NamedTuple):
    """What one model call of a plan gives: the logits (B, V) after each row's last token, and for each scored row
    (``Batch.scored``) the logits (its chunk's length, V) after each of its tokens."""

    last: torch.Tensor
    every: dict[int, torch.Tensor]


class ServingGPT:
    """extend(slots, chunks): append each chunk of tokens to its slot and return the next-token logits of each,
    the one operation behind a batch of prompts, a chunk of a long prompt and a decode step. save_blocks and
    load_blocks move a prompt prefix's keys and values between a slot and the prefix cache's blocks. execute runs
    a scheduler's plan with them."""

    def __init__(self, spec: ServingSpec, state: dict[str, torch.Tensor], slots: int, rank: int = 0,
                 world: int = 1, all_reduce: Optional[AllReduce] = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", prefix_blocks: int = 0,
                 block_size: int = PREFIX_BLOCK_SIZE):
        if spec.n_heads % world or spec.kv_heads % world:
            raise ValueError(f"tensor_parallel={world} must divide n_heads={spec.n_heads} and "
                             f"kv_heads={spec.kv_heads}")
        self.spec, self.device, self.dtype = spec, torch.device(device), dtype
        w = Weights(state, dtype, self.device)
        reduce = all_reduce if world > 1 else None
        self.tokens = w.tensor("embed.tokens.weight")
        self.positions = w.optional("embed.positions.weight")
        self.layers = []
        for i in range(spec.n_layers):
            p = f"layers.{i}"
            mlp = MoE(w, f"{p}.mlp", spec, rank) if spec.is_moe_layer(i) else MLP(w, f"{p}.mlp", spec.activation, rank)
            self.layers.append(dict(
                ln1=Norm(w, f"{p}.ln1", spec), ln2=Norm(w, f"{p}.ln2", spec),
                q=w.linear(f"{p}.attn.q"), k=w.linear(f"{p}.attn.k"), v=w.linear(f"{p}.attn.v"),
                out=RowParallel(w.linear(f"{p}.attn.out"), rank, reduce), mlp=mlp, reduce=reduce))
        self.norm = Norm(w, "norm", spec)
        self.head = self.tokens if spec.tied_embeddings or not w.has("head") else w.tensor("head.weight")
        self.group = spec.n_heads // spec.kv_heads
        kv_heads = spec.kv_heads // world
        self.cache = SlotCache(spec.n_layers, slots, kv_heads, spec.seq_len, spec.head_dim, dtype, self.device)
        self.prefix = PrefixBlocks(spec.n_layers, prefix_blocks, block_size, kv_heads, spec.head_dim, dtype,
                                   self.device)
        if spec.positions == "rope":
            inv_freq = inverse_frequencies(spec.head_dim, spec.rope_base, spec.rope_scaling)
            angles = torch.outer(torch.arange(spec.seq_len, dtype=torch.float32), inv_freq)  # (L, D/2)
            self.cos, self.sin = angles.cos().to(self.device), angles.sin().to(self.device)

    @property
    def slots(self) -> int:
        return len(self.cache.lengths)

    @property
    def prefix_blocks(self) -> int:
        return self.prefix.count

    @property
    def block_size(self) -> int:
        return self.prefix.block_size

    def _rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotary positions as the trainer applies them; x (B, heads, T, D), pos (B, T)."""
        cos, sin = self.cos[pos].unsqueeze(1).to(x.dtype), self.sin[pos].unsqueeze(1).to(x.dtype)  # (B, 1, T, D/2)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, counts: list[int],
                 fresh: bool, reach: int, scored: Sequence[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """ids, pos (B, T): row b's counts[b] new tokens, right-padded to T → the logits (B, V) after each row's
        last new token, and those after each of its new tokens (counts[b], V) for the rows in ``scored``; the new
        tokens' keys and values are written into the row's slot at their positions.
        fresh (every row starts at position 0: whole prompts, or first chunks): the new tokens attend to each other
        only, causally; a padding position comes after every real one, so no real token sees it. Otherwise each
        query attends to its slot's positions ≤ its own, up to ``reach`` (the most any row holds after this call),
        the new ones written first; a padding query repeats its row's last position. Padding positions' keys and
        values are never written, and every operation but attention is per token, so padding changes no real row."""
        B, T = ids.shape
        D = self.spec.head_dim
        x = F.embedding(ids, self.tokens)  # (B, T, C)
        if self.positions is not None:
            x = x + F.embedding(pos, self.positions)
        in_place = fresh and B == 1  # one whole prompt: its keys and values are the slot's first T positions
        if T > 1 and not in_place:  # where the real tokens' keys and values go: row bi's ti-th token, at pos[bi, ti]
            bi = torch.tensor([b for b, n in enumerate(counts) for _ in range(n)], device=self.device)
            ti = torch.tensor([t for n in counts for t in range(n)], device=self.device)
            write_slots, write_pos = slots[bi], pos[bi, ti]
        if not fresh:
            # Each row attends to its cached positions ≤ its own, read up to the longest row's, not the whole
            # window; consecutive slots are read in place, others gathered (a copy).
            L = reach
            visible = torch.arange(L, device=self.device).view(1, 1, 1, L) <= pos.view(B, 1, T, 1)  # (B, 1, T, L)
            rows = _as_range(slots)
        for i, layer in enumerate(self.layers):
            h = layer["ln1"](x)
            q = layer["q"](h).view(B, T, -1, D).transpose(1, 2)  # (B, H, T, D)
            k = layer["k"](h).view(B, T, -1, D).transpose(1, 2)  # (B, K, T, D)
            v = layer["v"](h).view(B, T, -1, D).transpose(1, 2)
            if self.spec.positions == "rope":
                q, k = self._rotate(q, pos), self._rotate(k, pos)
            keys, values = self.cache.keys[i], self.cache.values[i]
            if in_place:
                keys[slots[0], :, :T] = k[0]
                values[slots[0], :, :T] = v[0]
            elif T == 1:  # a decode step
                store_step(keys, values, slots, pos[:, 0], k[:, :, 0], v[:, :, 0])
            else:
                keys[write_slots, :, write_pos] = k[bi, :, ti]  # (N, K, D)
                values[write_slots, :, write_pos] = v[bi, :, ti]
            if fresh:
                kk, vv, mask = k, v, None  # the new tokens attend to themselves only
            else:
                kk, vv, mask = keys[rows, :, :L], values[rows, :, :L], visible  # (B, K, L, D)
            y = attend(q, kk, vv, mask, self.group, causal=fresh and T > 1)
            x = x + layer["out"](y.transpose(1, 2).reshape(B, T, -1))
            m = layer["mlp"](layer["ln2"](x))
            if layer["reduce"] is not None:
                layer["reduce"](m)
            x = x + m
        every = {row: F.linear(self.norm(x[row, :counts[row]]), self.head).float() for row in scored}
        if T > 1:  # of the other rows, only each row's last position's logits are needed
            x = x[torch.arange(B, device=self.device), torch.tensor([n - 1 for n in counts], device=self.device)]
        x = self.norm(x.view(B, -1))  # (B, C)
        return F.linear(x, self.head).float(), every  # (B, V)

    @torch.no_grad()
    def execute(self, plan: Plan) -> list[BatchLogits]:
        """Run a scheduler's plan (``scheduler.Plan``) in its order; the logits of each of its batches."""
        for admission in plan.admissions:
            if admission.blocks:
                self.load_blocks(admission.slot, admission.blocks)
            else:
                self.empty(admission.slot)
        for slot in plan.restarts:
            self.empty(slot)
        logits = [BatchLogits(*self._extend(batch.slots, batch.chunks, batch.scored)) for batch in plan.prefills]
        for save in plan.saves:
            self.save_blocks(save.slot, save.first, save.blocks)
        if plan.decode is not None:
            logits.append(BatchLogits(*self._extend(plan.decode.slots, plan.decode.chunks)))
        return logits

    @torch.no_grad()
    def extend(self, slots: list[int], chunks: list[list[int]]) -> torch.Tensor:
        """Append chunks[b] (≥ 1 token) to slot slots[b] after the positions it holds; logits (B, V) of the token
        after each chunk. The rows may start at different positions and have different lengths."""
        return self._extend(slots, chunks)[0]

    def _extend(self, slots: list[int], chunks: list[list[int]],
                scored: Sequence[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        starts = [self.cache.lengths[s] for s in slots]
        counts = [len(c) for c in chunks]
        for slot, start, n in zip(slots, starts, counts):
            if n < 1 or start + n > self.spec.seq_len:
                raise ValueError(f"slot {slot} holds {start} positions: it takes 1 to seq_len={self.spec.seq_len} "
                                 f"in all, not {n} more (a full slot is filled again over its last tokens)")
        T = max(counts)
        ids = torch.tensor([list(c) + [0] * (T - len(c)) for c in chunks], device=self.device)
        pos = torch.tensor([[start + min(t, n - 1) for t in range(T)] for start, n in zip(starts, counts)],
                           device=self.device)  # (B, T): a padding position repeats its row's last one
        logits = self._forward(ids, pos, torch.tensor(slots, device=self.device), counts, fresh=max(starts) == 0,
                               reach=max(start + n for start, n in zip(starts, counts)), scored=scored)
        for slot, n in zip(slots, counts):
            self.cache.lengths[slot] += n
        return logits

    def empty(self, slot: int) -> None:
        """Start the slot over: its positions are written again before they are read."""
        self.cache.lengths[slot] = 0

    @torch.no_grad()
    def save_blocks(self, slot: int, first: int, blocks: list[int]) -> None:
        """Copy the slot's positions of blocks first, first+1, … (block_size each) into prefix blocks ``blocks``."""
        b, n = self.block_size, len(blocks)
        index = torch.tensor(blocks, device=self.device)
        for cache, pool in ((self.cache.keys, self.prefix.keys), (self.cache.values, self.prefix.values)):
            for layer, blocks_of_layer in zip(cache, pool):
                kv = layer[slot, :, first * b:(first + n) * b]  # (K, n·b, D)
                blocks_of_layer[index] = kv.unflatten(1, (n, b)).transpose(0, 1)

    @torch.no_grad()
    def load_blocks(self, slot: int, blocks: list[int]) -> None:
        """Start ``slot`` over holding prefix blocks ``blocks``, in order, as its first positions."""
        b, n = self.block_size, len(blocks)
        index = torch.tensor(blocks, device=self.device)
        for cache, pool in ((self.cache.keys, self.prefix.keys), (self.cache.values, self.prefix.values)):
            for layer, blocks_of_layer in zip(cache, pool):
                layer[slot, :, :n * b] = blocks_of_layer[index].transpose(0, 1).flatten(1, 2)
        self.cache.lengths[slot] = n * b
