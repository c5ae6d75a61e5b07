"""The MPI side of the communication ops: one `Exchange` per rank, built from its LocalPart.

Mirror reduction: each rank sends the rows of its mirrors to their masters' ranks, which
combine them in rank order (so every run adds in the same order) into a row per master.
Broadcast: each master's row goes to the ranks that mirror it. All-reduce:
MPI's sum. Messages are nonblocking point-to-point pairs posted all at once, so no rank
waits on another's progress, and waiting yields the core between polls (then sleeps)
rather than spinning. The exchange counts the bytes it sends and the seconds it spends,
by kind: "sync" (mirrors and masters) and "allreduce" (weight gradients).
"""
import os
import time

import numpy as np

from ngnn.op_graph.combiners import COMBINERS

# A waiting rank polls, giving up its core between polls (sched_yield: a runnable
# process, its peer on an oversubscribed machine among them, runs first; alone on its core
# the rank polls again at once) for YIELD_FOR seconds, then sleeps between polls,
# FIRST_PAUSE doubling up to LONGEST_PAUSE, so a long wait (a peer evaluating) leaves the
# core idle. Sleeping from the first poll cost every exchange the OS's sleep overrun
# (about 60 us here), and a step makes tens of exchanges (ngnn.simulate prices the
# wake-up from the same schedule).
YIELD_FOR, FIRST_PAUSE, LONGEST_PAUSE = 2e-3, 1e-5, 1e-3


def world():
    """MPI.COMM_WORLD (mpi4py is imported only when ranks are used)."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise ValueError("distributed training needs mpi4py and an MPI: pip install "
                         "'ngnn[mpi]' (mpi4py and mpich)") from None
    return MPI.COMM_WORLD


def wait(requests):
    """Waits for MPI requests, yielding the core between polls, then sleeping (see
    YIELD_FOR): MPICH's own wait spins, and a spinning rank takes the core its peer (or
    another job) needs to get there."""
    if not requests:
        return
    from mpi4py import MPI
    if MPI.Request.Testall(requests):
        return
    give_up = time.perf_counter() + YIELD_FOR
    while time.perf_counter() < give_up:
        os.sched_yield()
        if MPI.Request.Testall(requests):
            return
    pause = FIRST_PAUSE
    while not MPI.Request.Testall(requests):
        time.sleep(pause)
        pause = min(2 * pause, LONGEST_PAUSE)


class Exchange:
    """Rank `part.rank` of a partition over communicator `comm`.

    `mirrors_from[q]` / `masters_to[q]`: local rows exchanged with rank q (see LocalPart).
    `restricted(key, active)` narrows a reduction, or run backwards a broadcast, to the
    mirrors with `active` rows (vertices with local edges at one end); both sides learn it
    once."""

    TAG = 7011

    def __init__(self, comm, part):
        if comm.Get_size() != part.num_parts:
            raise ValueError(f"the partition has {part.num_parts} parts but "
                             f"{comm.Get_size()} ranks run; start {part.num_parts} ranks "
                             f"(mpiexec -n {part.num_parts}) or partition for "
                             f"{comm.Get_size()}")
        if comm.Get_rank() != part.rank:
            raise ValueError(f"rank {comm.Get_rank()} was given part {part.rank}")
        self.comm = comm
        self.rank, self.size = part.rank, part.num_parts
        self.mirrors_from = dict(part.mirrors_from)
        self.masters_to = dict(part.masters_to)
        self.num_masters = part.num_masters
        self.bytes = {"sync": 0, "allreduce": 0}
        self.seconds = {"sync": 0.0, "allreduce": 0.0}
        self._restricted = {}

    @classmethod
    def for_slot(cls, comm, num_masters):
        """The exchange of a rank's slot for minibatches of graphs
        (ngnn.distributed.graph_loader): `num_masters` master rows (the slot's), and no
        exchange lists until `load` gives it a batch's."""
        exchange = cls.__new__(cls)
        exchange.comm = comm
        exchange.rank, exchange.size = comm.Get_rank(), comm.Get_size()
        exchange.num_masters = num_masters
        exchange.bytes = {"sync": 0, "allreduce": 0}
        exchange.seconds = {"sync": 0.0, "allreduce": 0.0}
        exchange.load({}, {})
        return exchange

    def load(self, mirrors_from, masters_to, restricted=None):
        """New exchange lists ({q: local rows}, as LocalPart's), for the next batch a
        rank's slot loads; the plans restricted from the old ones are forgotten.
        `restricted`: {key: (sends, receives)}, plans of `restricted` that the caller
        knows without the exchange of flags (every rank knowing them alike)."""
        self.mirrors_from, self.masters_to = dict(mirrors_from), dict(masters_to)
        self._restricted = dict(restricted or {})

    # ---- descriptions for the IR -------------------------------------------------------
    def describe(self, what):
        """The ranks an op of kind `what` involves, as IR attributes: a reduction receives
        from the ranks mirroring this rank's masters and sends to its mirrors' owners; a
        broadcast the other way round."""
        if what == "allreduce":
            return {"rank": self.rank, "ranks": tuple(range(self.size))}
        masters_side, mirrors_side = tuple(sorted(self.masters_to)), \
            tuple(sorted(self.mirrors_from))
        if what == "reduce":
            return {"rank": self.rank, "from": masters_side, "to": mirrors_side}
        return {"rank": self.rank, "from": mirrors_side, "to": masters_side}

    # ---- point-to-point ------------------------------------------------------------------
    def _swap(self, sends, receives, dtype, row_shape, kind):
        """Posts every send {q: array} and receive {q: rows}; returns {q: received}.
        Bytes and time count under `kind` (None: setup, not counted)."""
        start = time.perf_counter()
        requests, received = [], {}
        for q, rows in receives.items():
            received[q] = np.empty((rows,) + row_shape, dtype)
            requests.append(self.comm.Irecv(received[q], source=q, tag=self.TAG))
        for q, array in sends.items():
            array = np.ascontiguousarray(array)
            requests.append(self.comm.Isend(array, dest=q, tag=self.TAG))
            if kind:
                self.bytes[kind] += array.nbytes
            sends[q] = array          # kept alive until the send completes
        wait(requests)
        if kind:
            self.seconds[kind] += time.perf_counter() - start
        return received

    def restricted(self, key, active):
        """({q: mirror rows to send}, {q: master rows receiving}) for a reduction whose
        mirror rows count only where `active` (a bool per local row) holds; computed once
        per `key` with one exchange of flags."""
        if key not in self._restricted:
            flags = self._swap({q: active[rows].astype(np.uint8)
                                for q, rows in self.mirrors_from.items()},
                               {q: len(rows) for q, rows in self.masters_to.items()},
                               np.uint8, (), None)
            sends = {q: rows[active[rows]] for q, rows in self.mirrors_from.items()
                     if active[rows].any()}
            receives = {q: rows[flags[q].astype(bool)] for q, rows in self.masters_to.items()
                        if flags[q].any()}
            self._restricted[key] = (sends, receives)
        return self._restricted[key]

    def reduce(self, x, reduce, out, plan=None, kind="sync"):
        """Mirror-to-master reduction of x (a row per local vertex) into out (a row per
        master; see MirrorReduce). `plan` is `restricted(...)`'s pair, default every
        mirror."""
        sends, receives = plan or (self.mirrors_from, self.masters_to)
        got = self._swap({q: x[rows] for q, rows in sends.items()},
                         {q: len(rows) for q, rows in receives.items()}, x.dtype,
                         x.shape[1:], kind)
        np.copyto(out, x[:self.num_masters])
        combiner = COMBINERS[reduce]
        for q in sorted(got):
            combiner.fold(out, receives[q], got[q])
        return out

    def broadcast(self, x, out, plan=None, kind="sync"):
        """Master-to-mirror broadcast of x (a row per master) into out (a row per local
        vertex; see MasterBroadcast). `plan`: (master rows to send, mirror rows
        receiving) per peer, default every mirror; mirrors left out get 0."""
        sends, receives = plan or (self.masters_to, self.mirrors_from)
        got = self._swap({q: x[rows] for q, rows in sends.items()},
                         {q: len(rows) for q, rows in receives.items()}, x.dtype,
                         x.shape[1:], kind)
        out[:self.num_masters] = x
        if plan is not None:
            out[self.num_masters:] = 0
        for q, rows in receives.items():
            out[rows] = got[q]
        return out

    def allreduce(self, x, out):
        from mpi4py import MPI
        start = time.perf_counter()
        send = np.ascontiguousarray(x)
        result = np.empty_like(send)
        wait([self.comm.Iallreduce(send, result, op=MPI.SUM)])
        np.copyto(out, result.reshape(out.shape))
        self.bytes["allreduce"] += send.nbytes
        self.seconds["allreduce"] += time.perf_counter() - start
        return out

    def allgather(self, x, out=None):
        """(ranks,) + x.shape: every rank's x, in rank order, on every rank (a readout's
        per-graph partials; counted as "allreduce"), into `out` when given."""
        start = time.perf_counter()
        send = np.ascontiguousarray(x)
        result = np.empty((self.size,) + send.shape, send.dtype) if out is None else out
        wait([self.comm.Iallgather(send, result)])
        self.bytes["allreduce"] += send.nbytes
        self.seconds["allreduce"] += time.perf_counter() - start
        return result

    def packing(self, parts, dtype):
        """The runtime side of a PackedCollective (ngnn.op_graph) of `parts`, one
        (readout graph or None, reduce, shape) per member: None for an AllReduce of a
        tensor of `shape`, a RankReadoutGraph for a ReadoutAllReduce over it."""
        return Packing(self, parts, dtype)

    # ---- checks every rank takes part in ----------------------------------------------------
    def agree(self, what, problem):
        """Collective: every rank says what is wrong with its input (a message, or None),
        and when any rank has a problem every rank raises the same ValueError naming the
        ranks and their problems. A rank that raised alone would leave the others waiting
        in their next exchange forever."""
        problems = self.comm.allgather(None if problem is None else str(problem))
        bad = [f"on rank {r} of {self.size}: {p}" for r, p in enumerate(problems) if p]
        if bad:
            raise ValueError(f"{what}: " + "; ".join(bad))

    # ---- values outside the op-graph (metrics) --------------------------------------------
    def sum(self, values):
        """Sum over ranks of a small float64 array (losses, accuracy counts)."""
        from mpi4py import MPI
        values = np.asarray(values, dtype=np.float64)
        result = np.empty_like(values)
        wait([self.comm.Iallreduce(values, result, op=MPI.SUM)])
        return result

    def totals(self):
        """(bytes, seconds) per kind, bytes summed over ranks, seconds the slowest rank's."""
        from mpi4py import MPI
        kinds = ("sync", "allreduce")
        sent = [self.comm.allreduce(self.bytes[k], op=MPI.SUM) for k in kinds]
        seconds = [self.comm.allreduce(self.seconds[k], op=MPI.MAX) for k in kinds]
        return dict(zip(kinds, sent)), dict(zip(kinds, seconds))


class Packing:
    """Several collectives of one exchange as one allgather (PackedCollective): each
    member's rows go into one send buffer, the ranks' buffers are gathered, and each member
    combines its columns of them in rank order: an all-reduce adds them, a readout
    combines its graphs' rows as combine_ranks does. Both buffers are allocated once.
    `shapes`: the members' shapes; `size`: the elements of the packed result."""

    def __init__(self, exchange, parts, dtype):
        self.exchange, self.parts = exchange, tuple(parts)
        self.shapes = tuple(tuple(shape) for _, _, shape in self.parts)
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape in self.shapes]
        # A readout sends its graph rows only; the rows past them are the rank's own.
        sent = [size if graph is None else graph.num_dst * size // max(shape[0], 1)
                for (graph, _, shape), size in zip(self.parts, sizes)]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.sent_offsets = np.concatenate([[0], np.cumsum(sent, dtype=np.int64)])
        self.size = int(self.offsets[-1])
        self.send = np.empty(int(self.sent_offsets[-1]), dtype)
        self.every = np.empty((exchange.size, self.send.shape[0]), dtype)

    def run(self, inputs, out):
        """out (flat): each member's result over the ranks, given this rank's `inputs`."""
        spans = list(zip(self.parts, inputs, self.sent_offsets[:-1], self.sent_offsets[1:],
                         self.offsets[:-1], self.offsets[1:]))
        for (graph, _, _), x, a, b, _, _ in spans:
            self.send[a:b] = (x if graph is None else x[:graph.num_dst]).reshape(-1)
        every = self.exchange.allgather(self.send, out=self.every)
        for (graph, reduce, shape), x, a, b, start, stop in spans:
            result = out[start:stop].reshape(shape)
            if graph is None:           # an all-reduce: the sum in rank order
                np.copyto(result, every[0, a:b].reshape(shape))
                for partial in every[1:, a:b]:
                    result += partial.reshape(shape)
            else:
                graph.combine_gathered(
                    x, every[:, a:b].reshape((self.exchange.size, graph.num_dst) + shape[1:]),
                    reduce, result)
        return out

    def __repr__(self):
        kinds = ["all_reduce" if graph is None else f"readout_{reduce}"
                 for graph, reduce, _ in self.parts]
        return f"Packing({', '.join(kinds)})"
