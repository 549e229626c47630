"""The saved-activations probe where the forwards run out of the caller's reach (a pipeline schedule's stages)."""
import torch
from torch import nn

from trainer.profiling.memory import SavedActivations


def _block() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def test_it_measures_the_first_forward_of_each_hooked_module_only_and_leaves_no_hook():
    torch.manual_seed(0)
    first, second, never = _block(), _block(), _block()
    x = torch.randn(4, 8)
    # Every graph stays alive until the end, so that no storage is freed and reused under another tensor's name.
    with SavedActivations() as alone:  # what one forward of each block saves
        expected = first(x).sum() + second(x).sum()

    probe = SavedActivations()
    with probe.around_first_forward([first, second, never]):
        total = first(x).sum()
        total = total + first(x).sum()  # a second forward of the same module: not measured
        total = total + second(x).sum()
        outside = torch.randn(4, 8, requires_grad=True)
        total = total + (outside * outside).sum()  # in no hooked module: not measured
    (expected + total).backward()
    assert probe.bytes == alone.bytes > 0
    for module in (first, second, never):
        assert not module._forward_pre_hooks and not module._forward_hooks
