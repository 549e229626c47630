"""Exact byte accounting on one rank: model states, and the activations autograd saves for backward.

Activations are measured, not modelled: ``SavedActivations`` sees every tensor autograd saves through
``torch.autograd.graph.saved_tensors_hooks`` and sums the sizes of the distinct storages behind them (views of
one buffer count once), leaving out parameters and views of parameters. This is what the Korthikanti et al.
table in docs/formulas.md counts, for this model, this precision and this plan. Non-reentrant activation
checkpointing saves its inputs through autograd too, so the probe sees what a checkpointed block keeps.
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding ``t``'s memory: a DTensor's local shard; the result a collective wrapped while it
    may still be in flight (``to_local()`` after an all-reduce), which has no storage of its own."""
    if isinstance(t, DTensor):
        t = t._local_tensor
    return t.elem if isinstance(t, AsyncCollectiveTensor) else t


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


# Autograd nodes that only reshape or cast: a tensor reached from a parameter through these alone is the weight
# itself in another form (autocast's 16-bit copy, a transposed view), not an activation.
_WEIGHT_FORMS = {"TBackward0", "ToCopyBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
                 "ExpandBackward0", "UnsafeViewBackward0"}


def _is_parameter(t: torch.Tensor) -> bool:
    if isinstance(t, nn.Parameter) or isinstance(getattr(t, "_base", None), nn.Parameter):
        return True
    node = t.grad_fn
    while node is not None and type(node).__name__ in _WEIGHT_FORMS:
        nxt = [f for f, _ in node.next_functions if f is not None]
        if len(nxt) != 1:
            return False
        node = nxt[0]
    return node is not None and type(node).__name__ == "AccumulateGrad" and t.grad_fn is not None


class SavedActivations:
    """Context manager: bytes of distinct non-parameter storages saved for backward while it is active. Where the
    forwards run out of the caller's reach (a pipeline schedule runs its stages' forwards and the loss itself),
    ``around_first_forward`` makes it active during the next forward of each module only."""

    def __init__(self, params: Iterable[torch.Tensor] = ()):
        self.exclude = {_storage_key(_local(p)) for p in params}
        self.storages: dict[tuple[str, int], int] = {}
        self._hooks = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not _is_parameter(t):
            local = _local(t)
            key = _storage_key(local)
            if key not in self.exclude and key[1] != 0:
                self.storages[key] = local.untyped_storage().nbytes()
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> "SavedActivations":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    @contextlib.contextmanager
    def around_first_forward(self, modules: Iterable[nn.Module]) -> Iterator["SavedActivations"]:
        """Inside: active during the next forward of each of ``modules``, then never again (hooks left on a module
        that ran no forward are removed on the way out)."""
        handles = [h for m in modules for h in self._once_around(m)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _once_around(self, module: nn.Module) -> list:
        def pre(mod, args):
            self.__enter__()

        def post(mod, args, out):
            self.__exit__(None, None, None)
            for h in handles:
                h.remove()

        handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        return handles


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        local = _local(t)
        if local.numel():
            seen[_storage_key(local)] = local.untyped_storage().nbytes()
    return sum(seen.values())


def model_state_bytes(modules: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (local shards only)."""
    params = [p for m in modules for p in m.parameters()]
    state = [v for opt in optimizers for s in opt.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.dim() > 0]
    return {
        "params_bytes": tensor_bytes(params),
        "grads_bytes": gradient_bytes(modules),
        "optimizer_bytes": tensor_bytes(state),
    }


def gradient_bytes(modules: list[nn.Module]) -> int:
    return tensor_bytes(p.grad for m in modules for p in m.parameters() if p.grad is not None)


def max_allocated_bytes(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
