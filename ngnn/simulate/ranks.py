"""Predicting a run over K ranks without starting them.

Each rank's computation is built the way `mpiexec -n K ngnn train --partition P` builds it
(ngnn.distributed: the partition's part for that rank, the DistributedTrainer and its
lowering), over a `PlanningComm`: a communicator that answers what building needs (its
rank and size) and moves nothing, so the computations are the ones the ranks would run
and no process is started. `joint_timeline` then walks the ranks' predicted steps
together: a rank computes on its own until a communication op, where every rank waits
for the last to arrive (bulk-synchronous, as the exchange's matched sends and receives
make it), and the exchange takes the longest of the ranks' priced exchanges.

Ranks sharing a device (this machine's cores) compute more slowly: by the link's
calibrated contention of 2 ranks on this machine (calibration's kernels run side by side:
they share the memory and the last-level cache, and with more than one BLAS thread per
process, the cores) and by the share of a core each gets when there are more ranks than
cores. A rank waiting at an exchange notices its end at its next poll
(ngnn.distributed.exchange.wait yields its core between polls, then sleeps between them).
"""
from ..op_graph import AllReduce, MasterBroadcast, MirrorReduce

COMMUNICATION = (MirrorReduce, MasterBroadcast, AllReduce)


class PlanningComm:
    """An MPI communicator's face for building rank `rank` of `size`: the lowering reads
    its rank and size; exchanges made while building (whole-graph degrees, the self-loop
    count) return zeros and this rank's own values, which change numbers fed to the
    computation, never its ops or shapes. Requests are MPI's null request."""

    def __init__(self, size, rank, world=None):
        self.size, self.rank = int(size), int(rank)
        # The LocalGraphs of all ranks once built (rank_trainers fills it): what a rank's
        # exchanges would learn from its peers (ngnn.simulate.cost.exchange_rows).
        self.world = world if world is not None else []

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return self.rank

    @staticmethod
    def _null():
        from mpi4py import MPI
        return MPI.REQUEST_NULL

    def Irecv(self, buffer, source=None, tag=None):
        buffer[...] = 0
        return self._null()

    def Isend(self, buffer, dest=None, tag=None):
        return self._null()

    def Iallreduce(self, send, receive, op=None):
        receive[...] = send
        return self._null()

    def Allreduce(self, send, receive, op=None):
        receive[...] = send

    def allreduce(self, value, op=None):
        return value

    def allgather(self, value):
        return [value] + [value[:0] for _ in range(self.size - 1)]

    def Bcast(self, buffer, root=0):
        return None

    def Barrier(self):
        return None


def rank_trainers(make_trainer, data, num_parts, policy):
    """[trainer of rank r for r in range(num_parts)]: `make_trainer(part, comm)` builds
    a DistributedTrainer for a LocalPart over the given communicator."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise ValueError("predicting ranks builds each rank's computation as MPI runs it, "
                         "which needs mpi4py: pip install 'ngnn[mpi]'") from None
    from ..distributed import partition
    parts = partition(data.graph, num_parts, policy)
    world = []
    trainers = [make_trainer(parts.part(r), PlanningComm(num_parts, r, world))
                for r in range(num_parts)]
    world += [trainer.local_graph for trainer in trainers]
    return trainers, parts


def slowdown(topology, ranks):
    """How much slower each of `ranks` ranks computes than one rank alone on its device."""
    device = topology.device(0)
    if ranks <= 1 or device.cores is None:
        return 1.0
    return topology.link(0, 1).contention * max(1.0, ranks / device.cores)


def joint_timeline(reports, topology):
    """Seconds per step of the ranks' reports run together (see the module's text), with
    (compute, communication and waiting) seconds of the slowest rank."""
    factor = slowdown(topology, len(reports))
    segments = []
    for report in reports:
        pieces, compute = [], 0.0
        for step in report.ops:
            if step.kind == "comm":
                pieces.append((compute, step.seconds))
                compute = 0.0
            else:
                compute += factor * step.seconds
        pieces.append((compute, 0.0))
        segments.append(pieces)
    if len({len(s) for s in segments}) != 1:
        raise ValueError("the ranks' computations differ in their communication ops: "
                         "cannot line them up")
    slack = topology.link(0, 1).poll_slack if len(reports) > 1 else 0.0
    clocks = [0.0] * len(reports)
    busy = [0.0] * len(reports)
    communication = 0.0
    for i in range(len(segments[0])):
        for r, pieces in enumerate(segments):
            clocks[r] += pieces[i][0]
            busy[r] += pieces[i][0]
        exchange = max(pieces[i][1] for pieces in segments)
        if exchange:
            # The last rank to arrive finds its peers' messages there; the others notice
            # the end of the exchange at their next poll.
            last = max(range(len(clocks)), key=clocks.__getitem__)
            done = clocks[last] + exchange
            clocks = [done if r == last else c + woken(done - c, slack)
                      for r, c in enumerate(clocks)]
            communication += exchange
    total = max(clocks)
    compute = max(busy)
    return total, compute, communication, max(0.0, total - compute - communication)


def woken(wait, slack):
    """Seconds until a rank whose exchange ends `wait` seconds after it started waiting
    notices: ngnn.distributed.exchange.wait polls between yields of its core for
    YIELD_FOR seconds (noticing at once), then after each pause, the pauses doubling from
    FIRST_PAUSE to LONGEST_PAUSE and each overrun by the OS's `slack`."""
    from ..distributed.exchange import FIRST_PAUSE, LONGEST_PAUSE, YIELD_FOR
    if wait <= YIELD_FOR:
        return wait
    elapsed, pause = YIELD_FOR, FIRST_PAUSE
    while elapsed < wait:
        elapsed += pause + slack
        pause = min(2 * pause, LONGEST_PAUSE)
    return elapsed
