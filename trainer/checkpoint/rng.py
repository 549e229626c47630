"""Random-number generator states per rank (``rng-rank<r>.pt`` in a checkpoint folder), the same for both engines."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def rng_path(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rng-rank{rank}.pt"


def save_rng(folder: Path, rank: int) -> None:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    torch.save(state, rng_path(folder, rank))


def restore_rng(folder: Path, rank: int) -> bool:
    """Restore this rank's states if the folder has them; False when it does not."""
    path = rng_path(folder, rank)
    if not path.is_file():
        return False
    state: dict[str, Any] = torch.load(path, weights_only=False)
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    return True
