"""Minibatches: neighbour sampling and one compiled training step for every batch."""
from .sampler import Batch, NeighborSampler
from .slot import GraphSlot

__all__ = ["Batch", "NeighborSampler", "GraphSlot"]
