"""Graph passes: one pass per module."""
from .aggregate_transform_order import AggregateTransformOrder
from .base import GraphPass, PeepholeGraphPass, RewritePass, visit
from .block_planning import BlockPlan, BlockPlanning
from .buffer_sharing import BufferSharing, MemoryPlan
from .cse import CSE
from .decompose import Decompose
from .edge_sums_by_vertex import EdgeSumsByVertex
from .factor_products import FactorProducts
from .fusion import FusedGroup, Fusion
from .kernel_planning import KernelGroup, KernelPlanning
from .operation_batching import OperationBatching
from .pack_collectives import PackCollectives
from .recompute_dropout import RecomputeDropout
from .simple_prune import SimplePrune
from .softmax_by_log_sum_exp import SoftmaxByLogSumExp
from .split_contractions import SplitContractions
from .unshare_broadcasts import UnshareBroadcasts
from .wide_accumulation import WideAccumulation
from .zero_row_products import ZeroRowProducts

__all__ = ["GraphPass", "PeepholeGraphPass", "RewritePass", "visit", "SimplePrune", "CSE", "OperationBatching",
           "AggregateTransformOrder", "FactorProducts", "RecomputeDropout", "Fusion", "FusedGroup",
           "BlockPlanning", "BlockPlan",
           "SplitContractions", "KernelPlanning", "KernelGroup", "BufferSharing", "MemoryPlan",
           "WideAccumulation", "SoftmaxByLogSumExp", "Decompose",
           "ZeroRowProducts", "EdgeSumsByVertex",
           "UnshareBroadcasts", "PackCollectives"]
