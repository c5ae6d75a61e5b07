"""Graph passes: one pass per module."""
from .aggregate_transform_order import AggregateTransformOrder
from .base import GraphPass, PeepholeGraphPass, visit
from .buffer_sharing import BufferSharing, MemoryPlan
from .cse import CSE
from .factor_products import FactorProducts
from .fusion import FusedGroup, Fusion
from .operation_batching import OperationBatching
from .simple_prune import SimplePrune

__all__ = ["GraphPass", "PeepholeGraphPass", "visit", "SimplePrune", "CSE", "OperationBatching", "AggregateTransformOrder", "FactorProducts",
           "Fusion", "FusedGroup",
           "BufferSharing", "MemoryPlan"]
