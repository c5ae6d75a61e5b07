"""Beyond one process: partitions with masters and mirrors, and training over MPI ranks
that equals training in one process (docs/distributed.md).

    from ngnn import distributed as dist
    parts = dist.partition(g, num_parts=4, policy="cvc")
    parts.save("parts/")
    part = dist.load_partition("parts/", rank)
"""
from .partition import POLICIES, LocalPart, Partition, load_partition, partition
from .exchange import Exchange, world
from .local_graph import LocalGraph, MasterView, RankReadoutGraph
from .lowering import insert_communication
from .trainer import DistributedTrainer
from .graphs import DistributedGraphTrainer, RankBatch
from .graph_loader import DistributedGraphLoaderTrainer, RankBatchSlot, RankGraphLoader
from . import launch
