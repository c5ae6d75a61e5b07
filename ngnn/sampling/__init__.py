"""Minibatches: neighbour sampling and one compiled training step for every batch."""
from .sampler import Batch, NeighborSampler
from .slot import GraphSlot
from .negative import NegativeSampler

__all__ = ["Batch", "NeighborSampler", "GraphSlot"]
__all__ += ["NegativeSampler"]
