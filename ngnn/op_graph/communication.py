"""Communication ops (seed 001, DistIR): what ranks exchange is part of the op-graph.

A partition's local graph (ngnn.distributed) holds, on each rank, the masters of some
vertices and mirrors of the remote vertices its edges touch. A model's node tensors have a
row per master; graph ops run over every local vertex. Three ops move data between ranks,
each with the rank it runs on and the peers it talks to printed in the IR:

* `MirrorReduce`: a tensor with a row per local vertex (a partial aggregation) becomes one
  with a row per master: each master's row combined (sum, max or min) with its mirrors'
  rows on the other ranks (by its kind's row of the reduction table).
* `MasterBroadcast`: a tensor with a row per master becomes one with a row per local
  vertex: each mirror gets its master's row (what a gather reads).
* `AllReduce`: every rank gets the sum over ranks (weight gradients).
* `ReadoutAllReduce`: a readout's per-graph partials (each rank's vertices of every graph
  reduced) combined over the ranks in rank order, on every rank (graph classification
  over ranks: ngnn.distributed.graphs).
* `PackedCollective`: several all-reduces and readout all-reduces that no one of them
  feeds, run as one collective (ngnn.passes.PackCollectives makes it after autodiff).

Summing over ranks, the adjoint of a mirror-to-master sum is the master-to-mirror
broadcast and the other way round; all-reduce is its own adjoint. The ops are stateful so
no pass folds or merges them away.
"""
from .combiners import combiner_of
from .op import Attr, Op, as_ops
from .work import Work, nbytes


def partial_combiner(reduce, what):
    """The table row partial results combine with across ranks: any kind but those that
    divide by a count (a mean's partials are sums, divided afterwards)."""
    row = combiner_of(reduce, what)
    if row.divides:
        raise ValueError(f"{what}: partial results of a {reduce} combine as "
                         f"{row.partial}s; reduce them with {row.partial!r} and divide")
    return row


class Communication(Op):
    kind = "comm"
    is_stateful = True

    def __init__(self, x, shape=None, name=None):
        (x,) = as_ops(x)
        super().__init__([x], shape=x.shape if shape is None else shape, dtype=x.dtype,
                         scope=x.scope, name=name)

    def printed_attrs(self):
        return {k: v for k, v in self.attrs().items() if k != "graph"}


class MirrorReduce(Communication):
    """out[master] = reduce(its row of x and its mirrors' rows on the other ranks); x has a
    row per local vertex, out a row per master. With `at` ("dst" or "src"), x is a partial
    aggregation at that end: only copies with local edges there take part (the others hold
    no contribution: they send nothing, and for max and min their 0 is no candidate), and
    a vertex with no edges anywhere gets 0. With at=None every copy takes part."""
    attributes = (Attr("graph"), Attr("reduce"), Attr("at"))

    def __init__(self, x, graph, reduce="sum", at=None, name=None):
        partial_combiner(reduce, "mirror_reduce")
        if reduce != "sum" and at is None:
            raise ValueError("mirror_reduce: max, min and prod reduce partial aggregations; "
                             "name their end with at=")
        self.graph, self.reduce, self.at = graph, reduce, at
        (x,) = as_ops(x)
        if x.shape[:1] != (graph.num_nodes,):
            raise ValueError(f"mirror_reduce: expected a tensor of {graph.num_nodes} rows "
                             f"(one per local vertex), got shape {x.shape}")
        super().__init__(x, shape=(graph.num_masters,) + x.shape[1:], name=name)

    @property
    def combiner(self):
        return combiner_of(self.reduce)

    # Mirrors' rows sent to their masters and combined there (priced by the rows each
    # peer exchanges: ngnn.simulate.cost.communication).
    work = (Work("mirror_reduce"),)

    def attrs(self):
        at = {} if self.at is None else {"at": self.at}
        return {"graph": self.graph, "reduce": self.reduce, **at,
                **self.graph.exchange.describe("reduce")}

    def adjoints(self, delta):
        if self.reduce != "sum":
            raise ValueError(f"mirror_reduce {self.reduce} has no gradient: use it under "
                             "ng.stop_gradient (as GAT's softmax shift is)")
        return [MasterBroadcast(delta, self.graph, self.at)]


class MasterBroadcast(Communication):
    """out[master] = x[master], out[mirror] = x[its master] on the owning rank; x has a row
    per master, out a row per local vertex. With `at` ("src" or "dst": a gather by that
    end reads out), only the mirrors with local edges at that end receive; the other
    mirror rows are 0."""
    attributes = (Attr("local_graph", param="graph"), Attr("at"))
    derived = ("graph",)

    def __init__(self, x, graph, at=None, name=None):
        self.at = at
        # The object the kernels call: with `at`, the graph as that end's gathers see it.
        self.graph = graph if at is None else graph.gathered_at(at)
        (x,) = as_ops(x)
        if x.shape[:1] != (graph.num_masters,):
            raise ValueError(f"master_broadcast: expected a tensor of {graph.num_masters} "
                             f"rows (one per master), got shape {x.shape}")
        super().__init__(x, shape=(graph.num_nodes,) + x.shape[1:], name=name)

    @property
    def local_graph(self):
        return self.graph if self.at is None else self.graph.local

    work = (Work("master_broadcast"),)       # masters' rows sent to their mirrors

    def attrs(self):
        at = {} if self.at is None else {"at": self.at}
        return {"graph": self.graph, **at, **self.graph.exchange.describe("broadcast")}

    def adjoints(self, delta):
        return [MirrorReduce(delta, self.local_graph, "sum", self.at)]


class AllReduce(Communication):
    """The sum of x over every rank of `exchange`, on every rank."""
    attributes = (Attr("exchange"),)

    def __init__(self, x, exchange, name=None):
        self.exchange = exchange
        super().__init__(x, name=name)

    @property
    def work(self):
        return (Work("all_reduce", moved=nbytes(self)),)

    def attrs(self):
        return self.exchange.describe("allreduce")

    def adjoints(self, delta):
        return [AllReduce(delta, self.exchange)]


class ReadoutAllReduce(Communication):
    """x: a rank's partial readout, an aggregation at the graphs of its readout graph
    `graph` (ngnn.distributed.graphs.RankReadoutGraph: the rank's masters -> their graphs),
    whose first num_graphs rows are per graph. out: those rows combined over every rank in
    rank order (sum; max or min over the ranks that hold vertices of the graph, 0 for a
    graph without vertices), the same on every rank; the rows past the graphs stay x's.

    Every rank's loss reads the whole readout, so the adjoint of the sum is the sum of the
    ranks' gradients. For max and min the gradient goes to the vertices that reach the
    extreme, ties sharing it equally over all ranks as in one process: the rank's partial,
    where it is the whole value, gets the summed gradient times its share of the ties
    (the aggregation's own adjoint then splits it among the rank's tied vertices)."""
    attributes = (Attr("graph"), Attr("reduce"))

    def __init__(self, x, graph, reduce="sum", name=None):
        partial_combiner(reduce, "readout_all_reduce")
        (x,) = as_ops(x)
        if x.shape[:1] != (graph.num_nodes,):
            raise ValueError(f"readout_all_reduce: expected a partial readout of "
                             f"{graph.num_nodes} rows, got shape {x.shape}")
        self.graph, self.reduce = graph, reduce
        super().__init__(x, name=name)

    @property
    def combiner(self):
        return combiner_of(self.reduce)

    def attrs(self):
        return {"graph": self.graph, "reduce": self.reduce,
                **self.graph.exchange.describe("allreduce")}

    def adjoints(self, delta):
        total = ReadoutAllReduce(delta, self.graph, "sum")
        if self.reduce == "sum":
            return [total]
        if self.reduce not in ("max", "min"):
            raise ValueError(f"readout_all_reduce {self.reduce} has no gradient")
        from .elementwise import Equal, Maximum
        from .graph_ops import Aggregate, Gather
        partial = self.args[0]
        if not (isinstance(partial, Aggregate) and partial.graph is self.graph):
            raise ValueError(f"readout_all_reduce {self.reduce} has a gradient over a "
                             "partial readout (an aggregation over its graph) only")
        g = partial.graph
        won = Equal(partial, self)
        local_ties = Aggregate(Equal(partial.args[0], Gather(partial, g, by="dst")), g,
                               at="dst", reduce="sum")
        ties = ReadoutAllReduce(local_ties * won, g, "sum")
        return [total * won * local_ties / Maximum(ties, 1.0)]


class PackedCollective(Communication):
    """Several collectives (AllReduce, ReadoutAllReduce) of one communicator in one message:
    `packing` (the exchange's Exchange.packing) says which each argument is; out is their
    results one after the other, flattened, each member reading its part (see
    ngnn.passes.PackCollectives). Every member combines over the ranks in rank order, as a
    ReadoutAllReduce does, so a packed sum equals the member's own on 2 ranks bit for bit,
    and on any number of ranks is the same on every rank and in every run."""
    attributes = (Attr("packing"),)

    def __init__(self, *xs, packing, name=None):
        xs = as_ops(*xs)
        self.packing = packing
        if [x.shape for x in xs] != [shape for shape in packing.shapes]:
            raise ValueError(f"packed_collective: expected arguments of shapes "
                             f"{list(packing.shapes)}, got {[x.shape for x in xs]}")
        Op.__init__(self, list(xs), shape=(packing.size,), dtype=xs[0].dtype, name=name)

    @property
    def exchange(self):
        return self.packing.exchange

    @property
    def work(self):
        return (Work("all_reduce", moved=nbytes(self)),)

    def attrs(self):
        return {"packing": self.packing, **self.packing.exchange.describe("allreduce")}
