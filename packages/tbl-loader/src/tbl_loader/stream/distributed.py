"""Rank and world size of this process: explicit values, else torch.distributed, else a single process."""

from __future__ import annotations

import sys

__all__ = ["resolve_rank_world"]


def _from_torch() -> tuple[int, int] | None:
    # torch.distributed cannot be initialized unless it was imported: no torch import here.
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def resolve_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the given values, missing ones from an initialized torch.distributed
    process group, and otherwise ``(0, 1)``. Raises ValueError for an impossible pair."""
    if rank is None or world_size is None:
        found = _from_torch()
        if found is not None:
            rank = found[0] if rank is None else rank
            world_size = found[1] if world_size is None else world_size
        elif rank is not None and rank != 0:
            raise ValueError(f"rank={rank} needs world_size (torch.distributed is not initialized)")
        else:
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return rank, world_size
