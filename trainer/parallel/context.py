"""Context parallel: cp ranks share one sequence; each holds 2 of its 2·cp chunks and attention runs as a ring.

The zig-zag split (the load-balanced layout of Megatron-LM's and torchtitan's context parallel): the sequence of T
positions is cut into 2·cp chunks of c = T/(2·cp); cp rank r holds chunks r and 2cp−1−r, so every rank holds one
early and one late chunk and the causal mask gives every rank the same work. Inputs, targets and the
positions the model sees (rotary angles, learned position rows) are cut the same way (``zigzag_positions``,
``zigzag_slice``). Everything but attention works on each position alone, so it runs unchanged on a rank's T/cp
positions; each rank's loss is the mean over its T/cp tokens, and since every rank holds as many, the mean of the cp
means (the gradient average over dp·cp) is the mean over the whole sequence, as one process computes it.

Ring attention (Liu, Zaharia and Abbeel 2023; ``RingAttention``, a torch.autograd.Function): a rank's queries must
meet the keys and values of every chunk. Forward passes each rank's K/V block once around the cp ring (cp − 1 hops,
point-to-point isend/irecv to the next rank, the next block in flight while this one is computed) and merges the
blocks' softmaxes exactly through their log-sum-exps (online softmax). Point-to-point rather than an all-gather: a
rank never holds more than two K/V blocks (memory O(T/cp), not O(T)), and each hop's transfer hides behind one
block's attention. With the zig-zag layout the block from rank s, for this rank r, is
- s = r: the rank's own two chunks, in position order: causal attention;
- s < r: chunk s precedes both of this rank's chunks and chunk 2cp−1−s follows both: all queries, first half of
  the keys, no mask;
- s > r: both of its chunks follow chunk r and precede chunk 2cp−1−r: second half of the queries, all keys, no mask.
So each step after the first costs half a block, on every rank alike. Backward recomputes nothing but the
per-block gradients from the saved merged output and log-sum-exp (the flash-attention identity: a block's dS uses
the whole row's softmax, P = exp(S − lse), and D = rowsum(dO ∘ O)), passing K/V around the ring again with their
gradient accumulators beside them; after cp hops each dK/dV is back on the rank that owns it.
Grouped-query attention: K/V travel with their K heads (H/K times fewer bytes); the fused CPU kernel reads them
shared, the plain formula repeats them for the block and sums their gradients back over each group of query heads.

Each block's attention is torch's fused CPU kernel (the one F.scaled_dot_product_attention runs there, called for
its log-sum-exp); on other devices the plain fp32 formula, O(block²) memory, until a fused kernel with log-sum-exp
is wired in. torch's own context_parallel has no sharding rule for the CPU kernel, and this one runs on gloo.

Attention dropout would need the ranks to draw one mask of the whole T × T matrix between them; the contract
refuses dropout (and mixture-of-experts layers, whose routing capacity and balance loss count a rank's tokens) under
cp > 1 (``trainer.contract.rules``).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist


# ---------------------------------------------------------------- the zig-zag split

def zigzag_positions(length: int, cp: int, rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The positions (of a sequence of ``length``) that cp rank ``rank`` holds, in order: chunk r then 2cp−1−r."""
    if length % (2 * cp):
        raise ValueError(f"context parallel cuts a sequence of {length} positions into 2·cp={2 * cp} equal chunks; "
                         f"2·cp does not divide {length}")
    c = length // (2 * cp)
    first = torch.arange(rank * c, (rank + 1) * c, device=device)
    second = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, device=device)
    return torch.cat((first, second))


def zigzag_slice(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's share of ``t`` along ``dim`` (the sequence): chunks r and 2cp−1−r, concatenated."""
    chunks = t.chunk(2 * cp, dim=dim)
    return torch.cat((chunks[rank], chunks[2 * cp - 1 - rank]), dim=dim)


def zigzag_gather(parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The inverse of ``zigzag_slice`` over all cp ranks' ``parts`` (for tests and checks): the whole sequence."""
    cp = len(parts)
    halves = [p.chunk(2, dim=dim) for p in parts]
    order = [halves[r][0] for r in range(cp)] + [halves[r][1] for r in reversed(range(cp))]
    return torch.cat(order, dim=dim)


# ---------------------------------------------------------------- one block's attention, with its log-sum-exp

# Devices whose blocks run torch's fused kernel (with its log-sum-exp); the others the plain fp32 formula.
FUSED_DEVICES = ("cpu",)


def _block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ·scale [+ causal mask]) v and the rows' log-sum-exp (fp32, (B, H, Tq)), for k and v of K ≤ H heads.
    On the CPU torch's fused kernel (the one F.scaled_dot_product_attention runs; it reads shared key/value heads
    itself), elsewhere the plain fp32 formula on k and v repeated to H heads."""
    if q.device.type in FUSED_DEVICES:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q.contiguous(), k.contiguous(), v.contiguous(), 0.0, causal, scale=scale)
        return out, lse.float()
    g = q.size(1) // k.size(1)
    k, v = _expand(k, g), _expand(v, g)
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(_causal_mask(s), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse.unsqueeze(-1)) @ v.float()).to(q.dtype), lse


def _block_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv of one block, given the whole row's merged ``out`` and ``lse`` (so P here is the block's part of
    the row's softmax, not a softmax of its own); dk and dv of the K heads k and v have."""
    if q.device.type in FUSED_DEVICES:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(),
            lse.contiguous(), 0.0, causal, scale=scale)
    g = q.size(1) // k.size(1)
    qf, kf, vf, df = q.float(), _expand(k, g).float(), _expand(v, g).float(), dout.float()
    s = (qf @ kf.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(_causal_mask(s), float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ df
    dp = df @ vf.transpose(-2, -1)
    delta = (df * out.float()).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale
    return (ds @ kf).to(q.dtype), _reduce_heads(ds.transpose(-2, -1) @ qf, g).to(k.dtype), \
        _reduce_heads(dv, g).to(v.dtype)


def _causal_mask(s: torch.Tensor) -> torch.Tensor:
    tq, tk = s.shape[-2:]
    return torch.ones(tq, tk, dtype=torch.bool, device=s.device).triu(1)


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold one block's softmax into the running one, in place (fp32): the online-softmax rescaling."""
    new = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(block_out.float() * torch.exp(block_lse - new).unsqueeze(-1))
    lse.copy_(new)


def _expand(t: torch.Tensor, group: int) -> torch.Tensor:
    return t.repeat_interleave(group, dim=1) if group > 1 else t


def _reduce_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    """Sum the gradients of the ``group`` query heads that shared each key/value head."""
    if group == 1:
        return t
    b, h, n, d = t.shape
    return t.view(b, h // group, group, n, d).sum(2)


# ---------------------------------------------------------------- the ring

class _Ring:
    """Send to the next cp rank, receive from the previous one, asynchronously (one hop of the ring)."""

    def __init__(self, group):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def start(self, send: torch.Tensor) -> tuple[torch.Tensor, list]:
        recv = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group), dist.P2POp(dist.irecv, recv, self.prev, self.group)]
        return recv, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(requests: list) -> None:
        for req in requests:
            req.wait()


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's zig-zag share of q (B, H, L, D) against every rank's k, v (B, K, L, D)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, scale: Optional[float]):
        ring = _Ring(group)
        scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
        c = q.size(2) // 2
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack((k, v)).contiguous()
        for step in range(ring.size):
            pending = ring.start(kv) if step < ring.size - 1 else None
            src = (ring.rank - step) % ring.size
            kb, vb = kv[0], kv[1]
            if src == ring.rank:
                _merge(out, lse, *_block_forward(q, kb, vb, True, scale))
            elif src < ring.rank:
                _merge(out, lse, *_block_forward(q, kb[:, :, :c], vb[:, :, :c], False, scale))
            else:
                o2, l2 = out[:, :, c:], lse[:, :, c:]  # views: merged in place
                _merge(o2, l2, *_block_forward(q[:, :, c:], kb, vb, False, scale))
            if pending is not None:
                kv, requests = pending
                ring.wait(requests)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale = group, scale
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = _Ring(ctx.group), ctx.scale
        c = q.size(2) // 2
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack((k, v)).contiguous()
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)  # gradients of the K/V block held now
        for step in range(ring.size):
            pending = ring.start(kv) if step < ring.size - 1 else None
            src = (ring.rank - step) % ring.size
            kb, vb = kv[0], kv[1]
            if src == ring.rank:
                dqb, dkb, dvb = _block_backward(dout, q, kb, vb, out, lse, True, scale)
                dq += dqb
                dkv[0] += dkb
                dkv[1] += dvb
            elif src < ring.rank:
                dqb, dkb, dvb = _block_backward(dout, q, kb[:, :, :c], vb[:, :, :c], out, lse, False, scale)
                dq += dqb
                dkv[0][:, :, :c] += dkb
                dkv[1][:, :, :c] += dvb
            else:
                dqb, dkb, dvb = _block_backward(dout[:, :, c:], q[:, :, c:], kb, vb, out[:, :, c:], lse[:, :, c:],
                                                False, scale)
                dq[:, :, c:] += dqb
                dkv[0] += dkb
                dkv[1] += dvb
            # The gradient accumulator follows its K/V block: this rank's share added, on to the next rank.
            dkv_next, dkv_requests = ring.start(dkv)
            if pending is not None:
                kv, requests = pending
                ring.wait(requests)
            ring.wait(dkv_requests)
            dkv = dkv_next
        # After cp hops every accumulator is back on the rank whose K/V it holds gradients for.
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, scale: Optional[float] = None):
    """Causal attention over the whole sequence of which each cp rank of ``group`` holds its zig-zag share."""
    return RingAttention.apply(q, k, v, group, scale)


# ---------------------------------------------------------------- the model, wrapped from outside

def apply_cp(model, group, cp: int, cp_rank: int) -> None:
    """Make ``model`` (a whole model or one pipeline stage, after tensor parallel, before recomputation) run on
    this rank's zig-zag share of each sequence: every attention's weight-free core becomes ring attention over
    ``group`` at the share's positions, and learned position rows are looked up at those positions. The rest of
    the model works on each position alone and needs nothing."""
    for block in model.layers.values():
        block.attn.attend = _ring_attend(block.attn, group, cp, cp_rank)
    if model.embed is not None and model.embed.positions is not None:
        model.embed.forward = _at_share_positions(model.embed.forward, cp, cp_rank)


class _SharePositions:
    """The positions of this rank's share of a sequence, by the share's length (computed once per length)."""

    def __init__(self, cp: int, cp_rank: int):
        self.cp, self.cp_rank = cp, cp_rank
        self._known: dict[tuple[int, torch.device], torch.Tensor] = {}

    def __call__(self, local_length: int, device: torch.device) -> torch.Tensor:
        key = (local_length, device)
        if key not in self._known:
            self._known[key] = zigzag_positions(local_length * self.cp, self.cp, self.cp_rank, device)
        return self._known[key]


def _ring_attend(attn, group, cp: int, cp_rank: int):
    """Attention's ``attend`` (rotary positions, then softmax(q kᵀ/√D + causal mask) v) for a zig-zag share: rotary
    angles at the share's positions, key/value heads sent around the ring before they are repeated."""
    positions_of = _SharePositions(cp, cp_rank)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0, cache=None,
               positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        if cache is not None or start:
            raise RuntimeError("a key/value cache (generation) runs on one process, not under context parallel")
        if attn.rotary is not None:
            if positions is None:
                positions = positions_of(q.size(2), q.device)
            q, k = attn.rotary(q, 0, positions), attn.rotary(k, 0, positions)
        return ring_attention(q, k, v, group)
    return attend


def _at_share_positions(forward, cp: int, cp_rank: int):
    positions_of = _SharePositions(cp, cp_rank)

    def embed(idx: torch.Tensor, start: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        if positions is None:
            positions = positions_of(idx.size(1), idx.device)
        return forward(idx, start, positions)
    return embed
