"""Running a command on every rank of `mpiexec`: rank 0 speaks, a failing rank stops all.

MPI ranks wait for each other in every exchange, so a rank that fails and simply exits
would leave the others waiting forever. `run_on_ranks` prints the failing rank's message
and calls MPI_Abort, which makes mpiexec end every rank at once.
"""
import os
import shutil
import sys
import time
import traceback

from .exchange import world
from .partition import load_partition, partition

EXPECTED = (ValueError, RuntimeError, OSError, MemoryError)
# What mpiexec tells each rank it starts: the world's size (MPICH's hydra, Open MPI).
WORLD_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def find_mpiexec():
    """The mpiexec installed beside this Python (pip's mpich), else the one on PATH; None
    when there is neither."""
    for folder in (os.path.dirname(sys.executable), os.path.join(sys.base_prefix, "bin")):
        path = shutil.which("mpiexec", path=folder)
        if path:
            return path
    return shutil.which("mpiexec")


def launched_ranks(environ=os.environ):
    """How many ranks mpiexec started (1 outside mpiexec), read from the environment it
    gives each rank: importing mpi4py initializes MPI, which a single-process command
    should not pay for (nor fail on, where no MPI is installed)."""
    for name in WORLD_SIZE_VARIABLES:
        try:
            return max(int(environ[name]), 1)
        except (KeyError, ValueError):
            continue
    return 1


def run_on_ranks(command, func):
    """func() on this rank, with stdout only on rank 0; on any exception the rank prints
    "ngnn <command>: error on rank r of K: ..." (a traceback too, for unexpected ones)
    and aborts every rank. Returns func's exit status."""
    comm = world()
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank != 0:
        sys.stdout = open(os.devnull, "w")
    try:
        return func()
    except BaseException as err:       # noqa: B036 - any failure must stop every rank
        if not isinstance(err, EXPECTED):
            traceback.print_exc()
        where = f" on rank {rank} of {size}" if size > 1 else ""
        kind = "" if isinstance(err, EXPECTED) else type(err).__name__ + ": "
        print(f"ngnn {command}: error{where}: {kind}{err}", file=sys.stderr, flush=True)
        if size > 1:
            # mpiexec forwards a rank's stderr through its proxy, and an abort at once can
            # end the proxy before the message is through (seen in 1 run of 5).
            time.sleep(1.0)
            comm.Abort(1)
        return 1


def local_part(data, policy=None, folder=None):
    """This rank's LocalPart: part `rank` of `folder`'s saved partition, or of
    partition(data.graph, ranks, policy) computed here (METIS's answer is rank 0's, so
    every rank holds the same one)."""
    comm = world()
    rank, size = comm.Get_rank(), comm.Get_size()
    if folder is not None:
        part = load_partition(folder, rank)
        if part.num_parts != size:
            raise ValueError(f"the partition in {folder} has {part.num_parts} parts but "
                             f"{size} ranks run: start mpiexec -n {part.num_parts}")
        part.check_graph(data.graph)
        return part
    parts = partition(data.graph, size, policy)
    if policy == "metis" and size > 1:
        comm.Bcast(parts.owner, root=0)
        parts.edge_part = parts.owner[data.graph.dst]
    return parts.part(rank)


def describe(part):
    m = part.manifest
    return (f"partition {m['policy']} into {m['num_parts']} parts: replication factor "
            f"{m['replication_factor']:.3f}, vertex imbalance {m['vertex_imbalance']:.3f}, "
            f"edge imbalance {m['edge_imbalance']:.3f}")


def per_epoch(trainer, epochs):
    """Bytes (sent by all ranks) and seconds (of the slowest rank) of communication per
    epoch so far, as a line of text."""
    return epoch_line(trainer.communication(), epochs)


def epoch_line(totals, epochs):
    """per_epoch's line from an exchange's totals() over `epochs` epochs."""
    sent, seconds = totals
    epochs = max(epochs, 1)
    return (f"communication per epoch: mirror sync {sent['sync'] // epochs} bytes in "
            f"{1000 * seconds['sync'] / epochs:.1f} ms, gradient all-reduce "
            f"{sent['allreduce'] // epochs} bytes in "
            f"{1000 * seconds['allreduce'] / epochs:.1f} ms")


def bench_line(trainer, before, epochs):
    """Communication per epoch since `before` (an earlier trainer.communication())."""
    sent, seconds = trainer.communication()
    epochs = max(epochs, 1)
    parts = []
    for kind, label in (("sync", "mirror sync"), ("allreduce", "gradient all-reduce")):
        parts.append(f"{label} {(sent[kind] - before[0][kind]) / epochs / 1e6:.3f} MB in "
                     f"{1000 * (seconds[kind] - before[1][kind]) / epochs:.1f} ms")
    return "  communication per epoch: " + ", ".join(parts)
