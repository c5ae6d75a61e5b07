"""Tracing within a context (seed 000, option 3): `ng.zoomIn` records per-vertex Python as
ops of the local scopes `v`, `innbs` / `outnbs` and `inedge` / `outedge`; `ng.zoomOut`
marks a per-vertex value as a node tensor, lowered to whole-graph ops later
(`ngnn.frontend.lowering`)."""
import builtins
import functools

import numpy as np

from ..op_graph import Attr, Constant, Leaf, Maximum, Minimum, Op, ShapeError, as_ops
from ..op_graph.scopes import EDGE_SET
from ..errors import TracingError, at_user_line

RESERVED = ("innbs", "outnbs", "inedges", "outedges", "indegree", "outdegree")
PATCHED = ("sum", "max", "min", "zip")
_BUILTINS = {name: getattr(builtins, name) for name in PATCHED}
EDGE_SET_TEXT = {"inedge": "in-edges (v.innbs / v.inedges)",
                 "outedge": "out-edges (v.outnbs / v.outedges)"}


# ---- traced leaves and the ops only the front end makes --------------------------------------

class LocalFeature(Op):
    """A feature read at a local scope: the node (or edge) axis of `source` factored out.
    A sparse source stays sparse where it is lowered (n.h @ W becomes a sparse product)."""
    kind = "prim"
    takes_sparse = True
    is_edge_type = False     # e.type of a typed graph (what W[e.type] may be indexed by)
    attributes = (Attr("relation", printed=False),)

    def __init__(self, source, scope, context, relation=None):
        super().__init__([source], shape=source.shape[1:], dtype=source.dtype, scope=scope)
        self.zoom = context
        # Read through v.innbs.of_type(r) (or v.inedges...): only relation r's edges.
        self.relation = relation

    @property
    def op_name(self):
        return "feature"


class LocalDegree(Leaf):
    """The in- or out-degree of the current vertex (scope v) or of a neighbour, in the float
    dtype of the context's features (so float64 models stay float64)."""
    attributes = (Attr("which", printed=False), Attr("relation", printed=False))

    def __init__(self, which, scope, context, relation=None):
        super().__init__((), context.float_dtype, scope=scope)
        self.which = which
        self.zoom = context
        self.relation = relation     # read through .of_type(relation), as LocalFeature's

    @property
    def op_name(self):
        return self.which

    def degrees(self):
        graph = self.zoom.graph
        return graph.vertex_degrees("in" if self.which == "indegree" else "out")


class LocalAggregate(Op):
    """sum / mean / max / min of a value over the current vertex's in- or out-edges; a vertex
    without such edges gets 0."""
    attributes = (Attr("reduce", printed=False),)
    derived = ("over", "relation")

    def __init__(self, value, reduce):
        value.zoom.check_open()
        self.reduce = reduce
        self.over = EDGE_SET[value.scope]
        # Over the edges of this relation only (a value read through .of_type(r)), or all.
        self.relation = relation_of(value)
        super().__init__([value], shape=value.shape,
                         dtype=value.dtype if value.dtype.kind == "f" else np.float32,
                         scope="v")

    @property
    def kind(self):
        return "agg" if self.over == "inedge" else "srcagg"

    @property
    def op_name(self):
        return self.reduce


class RelationIndex(Op):
    """`W[e.type]`: the slice of a per-relation parameter W (R, ...) that belongs to each
    edge's relation. Lowered by ngnn/frontend/relations.py: inside a product with a node
    value, to a per-relation computation chosen by bytes; elsewhere, to a gather of W's rows
    onto the edges."""

    def __init__(self, table, index):
        (table, index) = as_ops(table, index)
        if not getattr(index, "is_edge_type", False):
            raise TracingError(at_user_line(
                f"indexing {table} by the tensor {index}: inside ng.zoomIn a parameter may be "
                "indexed by the edge type only, as W[e.type]"))
        graph = index.zoom.graph
        if table.scope is not None or table.ndim == 0 or \
                table.shape[0] != graph.num_relations:
            raise ShapeError(at_user_line(
                f"W[e.type]: W must be a parameter (or a tensor built from parameters) with "
                f"one row per relation ({graph.num_relations}), got {table}"
                + (" traced per vertex" if table.scope is not None else "")))
        super().__init__([table, index], shape=table.shape[1:], dtype=table.dtype)

    @property
    def op_name(self):
        return "relation_index"


def relation_of(value):
    """The relation r whose edges a per-edge value was read over (`v.innbs.of_type(r)`,
    `v.inedges.of_type(r)`), or None; two relations in one value are an error. Values
    inside a nested aggregation are that aggregation's business."""
    relations, seen, stack = set(), set(), [value]
    while stack:
        op = stack.pop()
        if op in seen or op.scope is None:
            continue
        seen.add(op)
        if isinstance(op, (LocalFeature, LocalDegree)) and op.relation is not None:
            relations.add(op.relation)
        if op is value or not isinstance(op, LocalAggregate):
            stack.extend(op.args)
    if len(relations) > 1:
        raise TracingError(at_user_line(
            f"this per-edge value reads the edges of relations {sorted(relations)} at once "
            "(through .of_type); an edge has one relation: aggregate each relation's "
            "values separately and combine the per-vertex results"))
    return relations.pop() if relations else None


def index_by_tensor(table, index):
    """x[t] with a tensor t: W[e.type] inside ng.zoomIn, and a clear error elsewhere."""
    if index.zoom is None:
        raise TypeError(f"indexing {table} by the tensor {index}: only W[e.type] inside "
                        "ng.zoomIn indexes by a tensor; use slices with Python ints, or "
                        "ng.one_hot and ng.dot for a data-dependent choice")
    return RelationIndex(table, index)


class ZoomOut(Op):
    """A traced value as a whole-graph tensor: a per-vertex value as a node tensor
    (num_dst,) + shape, a per-edge or per-neighbour value as an edge tensor
    (num_edges,) + shape in edge id order. Lowering forwards it to the whole-graph ops that
    compute it."""
    derived = ("over", "context")

    def __init__(self, value):
        graph = value.zoom.graph
        # None for a per-vertex value, else the edges the value has one row per.
        self.over = EDGE_SET.get(value.scope)
        if self.over is not None and relation_of(value) is not None:
            raise TracingError(at_user_line(
                f"ng.zoomOut of a value read through .of_type({relation_of(value)}): it has "
                "rows for that relation's edges only; aggregate it per vertex (ng.mean, "
                "sum, ...), or read it over all edges and select with e.type"))
        rows = graph.num_dst if self.over is None else graph.num_edges
        # An explicit scope skips the open-context check: zoomOut runs after the context.
        super().__init__([value], shape=(rows,) + value.shape, dtype=value.dtype, scope="v")
        self.context = value.zoom
        self.scope, self.zoom = None, None


def zoomOut(*values):
    """The whole-graph tensors of values traced in ng.zoomIn, one op or a tuple: a
    per-vertex value gives a node tensor; a per-edge value, or a neighbour list such as
    `[ng.sum(n.h * v.h) for n in v.innbs]`, gives an edge tensor with one row per edge of
    the graph, in edge id order (an edge-level output: the scores of a link predictor's
    query pairs)."""
    outs = []
    for value in values:
        if isinstance(value, (list, tuple)) and neighbour_value(value) is not None:
            value = value[0]
        if not isinstance(value, Op) or value.zoom is None:
            raise TracingError(at_user_line(
                f"ng.zoomOut needs a per-vertex or per-edge value traced inside ng.zoomIn "
                f"(or a list of one such value per neighbour), got {value!r}"))
        outs.append(ZoomOut(value))
    return outs[0] if len(outs) == 1 else tuple(outs)


# ---- proxies: what user code inside the context sees --------------------------------------

class _Proxy:
    """Reads features by attribute (`v.h`, `n.h`, `e.w`) at one scope."""

    def __init__(self, context, scope, kind, who, relation=None):
        self._context, self._scope, self._kind, self._who = context, scope, kind, who
        self._relation = relation

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._context.read(self._kind, name, self._scope, self._who, self._relation)

    def __repr__(self):
        return f"<{self._who}: {self._scope} proxy>"


class Neighbour(_Proxy):
    @property
    def indegree(self):
        return self._context.degree("indegree", self._scope, self._relation)

    @property
    def outdegree(self):
        return self._context.degree("outdegree", self._scope, self._relation)


class Neighbours:
    """v.innbs / v.outnbs / v.inedges / v.outedges: iterates once, yielding one proxy that
    stands for every neighbour (or edge) at the same time."""

    def __init__(self, context, proxy):
        self.context, self.proxy = context, proxy
        self.edge_set = EDGE_SET[proxy._scope]

    def __iter__(self):
        self.context.check_open()
        if self.edge_set == "outedge" and self.context.graph.is_block:
            raise TracingError(at_user_line(
                "v.outnbs / v.outedges: the graph is a block (num_dst < num_nodes), which holds "
                "the in-edges of its destination vertices only; use v.innbs / v.inedges"))
        yield self.proxy

    def of_type(self, relation):
        """The neighbours (or edges) over edges of one relation of a typed graph: values
        read through them are aggregated over that relation's edges only, so
        `ng.mean([... for n in v.innbs.of_type(r)])` divides by the vertex's number of
        relation-r edges (R-GCN's 1 / c_{i,r}); a vertex without such edges gets 0."""
        self.context.check_open()
        graph = self.context.graph
        if graph.edge_type is None:
            raise TracingError(at_user_line(
                f".of_type({relation!r}): {graph!r} has no edge types; build it with "
                "ng.Graph.from_edges(src, dst, num_nodes=N, edge_type=t, num_relations=R)"))
        if isinstance(relation, (bool, np.bool_)) or \
                not isinstance(relation, (int, np.integer)) or \
                not 0 <= relation < graph.num_relations:
            raise TracingError(at_user_line(
                f".of_type({relation!r}): the relation must be a Python int in [0, "
                f"{graph.num_relations}); to use each edge's own relation, write W[e.type]"))
        p = self.proxy
        return Neighbours(self.context, type(p)(self.context, p._scope, p._kind, p._who,
                                                int(relation)))

    def __len__(self):
        raise TracingError(at_user_line(
            f"len() of a neighbour list: the number of neighbours differs from vertex to "
            f"vertex, so it is a tensor, not a Python int; use v.indegree / v.outdegree"))

    def __getitem__(self, index):
        raise TracingError(at_user_line(
            "indexing a neighbour list: neighbours have no order, so there is no i-th one; "
            "aggregate over all of them (sum, max, min, ng.mean over "
            "[... for n in v.innbs])"))


class Vertex(_Proxy):
    def __init__(self, context):
        super().__init__(context, "v", "node", "v")
        self.innbs = Neighbours(context, Neighbour(context, "innbs", "node", "n"))
        self.outnbs = Neighbours(context, Neighbour(context, "outnbs", "node", "n"))
        self.inedges = Neighbours(context, _Proxy(context, "inedge", "edge", "e"))
        self.outedges = Neighbours(context, _Proxy(context, "outedge", "edge", "e"))

    @property
    def indegree(self):
        return self._context.degree("indegree", "v")

    @property
    def outdegree(self):
        return self._context.degree("outdegree", "v")


# ---- the context -------------------------------------------------------------------------------

class ZoomContext:
    """`caller` names the front end in error messages (ng.zoomIn, or ng.saga built on it)."""

    def __init__(self, graph, node_feat=(), edge_feat=(), caller="ng.zoomIn"):
        from ..graph import Graph
        if not isinstance(graph, Graph):
            raise TypeError(f"{caller}: expected an ng.Graph, got {graph!r}")
        self.graph = graph
        self.caller = caller
        self.node_features = _features(node_feat, "node_feat", graph.num_nodes, "nodes", caller)
        self.edge_features = _features(edge_feat, "edge_feat", graph.num_edges, "edges", caller)
        self.float_dtype = next((f.dtype for f in (*self.node_features.values(),
                                                   *self.edge_features.values())
                                 if f.dtype.kind == "f"), np.dtype(np.float32))
        self.state = "new"
        self.leaves = {}            # (kind, name or degree, scope) -> traced leaf
        self.lowering = None        # shared by every zoomOut of this context
        self.saved_builtins = None

    def __enter__(self):
        if self.state != "new":
            raise TracingError("an ng.zoomIn context can be entered once; call ng.zoomIn again")
        self.state = "open"
        self.saved_builtins = {name: getattr(builtins, name) for name in PATCHED}
        builtins.sum, builtins.max, builtins.min, builtins.zip = \
            traced_sum, traced_max, traced_min, traced_zip
        return Vertex(self)

    def __exit__(self, *exc):
        try:
            self.state = "closed"
        finally:
            for name, value in self.saved_builtins.items():
                setattr(builtins, name, value)
        return False

    def check_open(self):
        if self.state != "open":
            raise TracingError(at_user_line(
                "a value traced inside ng.zoomIn is used after its context closed; pass it "
                "to ng.zoomOut (inside or right after the context) and use the node tensor"))

    def read(self, kind, name, scope, who, relation=None):
        self.check_open()
        features = self.node_features if kind == "node" else self.edge_features
        if kind == "edge" and name == "type" and name not in features:
            return self.edge_types(scope, who, relation)
        if name not in features:
            available = ", ".join(features) or "none"
            raise AttributeError(at_user_line(
                f"{who}.{name}: there is no {kind} feature {name!r} in this {self.caller}; "
                f"available {kind} features: {available}"))
        key = (kind, name, scope, relation)
        if key not in self.leaves:
            self.leaves[key] = LocalFeature(features[name], scope, self, relation)
        return self.leaves[key]

    def edge_types(self, scope, who, relation=None):
        """`e.type`: the relation id of each edge of a typed graph (an int64 edge value)."""
        if self.graph.edge_type is None:
            raise AttributeError(at_user_line(
                f"{who}.type: {self.graph!r} has no edge types; build it with "
                "ng.Graph.from_edges(src, dst, num_nodes=N, edge_type=t, num_relations=R)"))
        key = ("edge", "type", scope, relation)
        if key not in self.leaves:
            types = Constant(self.graph.edge_type, dtype=np.int64, name="edge_type")
            self.leaves[key] = LocalFeature(types, scope, self, relation)
            self.leaves[key].is_edge_type = True
        return self.leaves[key]

    def degree(self, which, scope, relation=None):
        self.check_open()
        key = ("degree", which, scope, relation)
        if key not in self.leaves:
            self.leaves[key] = LocalDegree(which, scope, self, relation)
        return self.leaves[key]


def zoomIn(graph, node_feat=(), edge_feat=()):
    """Trace per-vertex code over `graph`:

        with ng.zoomIn(g, node_feat=[h]) as v:
            rst = sum(n.h for n in v.innbs)
        out = ng.zoomOut(rst)

    Features are given as a list of named tensors or a {name: tensor} dict; node features
    have one row per node, edge features one row per edge."""
    return ZoomContext(graph, node_feat, edge_feat)


def _features(given, what, rows, unit, caller):
    if given is None:
        given = ()
    if isinstance(given, dict):
        items = list(given.items())
    elif not isinstance(given, (list, tuple)):
        raise TypeError(f"{caller}: {what} must be a {{name: tensor}} dict or a list of named "
                        f"tensors, one row per graph {unit[:-1]}; got {given!r}")
    else:
        items = []
        for tensor in given:
            if not isinstance(tensor, Op) or not tensor.name:
                raise ValueError(f"{caller}: every {what} list entry needs a name (give "
                                 f"ng.placeholder a name=, or pass a dict); got {tensor!r}")
            items.append((tensor.name, tensor))
    features = {}
    for name, tensor in items:
        if name in features:
            raise ValueError(f"{caller}: two {what} entries are named {name!r}; pass a dict "
                             "to choose distinct names")
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_") or \
                name in RESERVED:
            raise ValueError(f"{caller}: {what} name {name!r} must be a Python identifier, "
                             f"not starting with '_' and none of {', '.join(RESERVED)}")
        if not isinstance(tensor, Op) and np.asarray(tensor).dtype.kind not in "biuf":
            raise TypeError(f"{caller}: {what} {name!r} must be a tensor (an ngnn op or a "
                            f"numeric array), got {tensor!r}")
        (tensor,) = as_ops(tensor)
        if tensor.ndim == 0 or tensor.shape[0] != rows:
            raise ShapeError(f"{caller}: {what} {name!r} has shape {tensor.shape}, but its "
                             f"first axis must have one row per graph {unit[:-1]} ({rows} "
                             f"{unit})")
        features[name] = tensor
    return features


# ---- builtins while a context is open ------------------------------------------------------

def neighbour_value(values):
    """The traced op of a neighbour list (one op with one value per neighbour or edge),
    else None."""
    if not isinstance(values, (list, tuple)) or len(values) != 1 or \
            not isinstance(values[0], Op) or values[0].zoom is None:
        return None
    value = values[0]
    if value.scope == "v":
        raise TracingError(at_user_line(
            f"this list holds one per-vertex value {value!r}, not one value per neighbour: "
            "build it from n.<feature> or e.<feature>; for a count of neighbours use "
            "v.indegree / v.outdegree"))
    return value if value.scope in EDGE_SET else None


def reduce_neighbours(values, reduce):
    """ng.sum / ng.mean / ng.max / ng.min over a neighbour list."""
    value = neighbour_value(values)
    if value is None:
        raise TracingError(at_user_line(
            f"ng.{reduce} over a list needs a neighbour list inside ng.zoomIn, such as "
            f"ng.{reduce}([n.h for n in v.innbs]); got {values!r}"))
    return LocalAggregate(value, reduce)


def traced_sum(iterable, /, start=0):
    try:
        iterator = iter(iterable)
    except TypeError:
        return _BUILTINS["sum"](iterable, start)
    values = list(iterator)
    value = neighbour_value(values)
    if value is None:
        return _BUILTINS["sum"](values, start)
    total = LocalAggregate(value, "sum")
    return total if type(start) in (int, float) and start == 0 else start + total


def _traced_extreme(reduce, pairwise):
    original = _BUILTINS[reduce]

    def extreme(*args, **kwargs):
        if "key" in kwargs:
            return original(*args, **kwargs)
        if len(args) == 1:
            try:
                iterator = iter(args[0])
            except TypeError:
                return original(*args, **kwargs)
            values = list(iterator)
            value = neighbour_value(values)
            return original(values, **kwargs) if value is None else LocalAggregate(value, reduce)
        if any(isinstance(a, Op) for a in args):
            return functools.reduce(pairwise, args)
        return original(*args, **kwargs)

    extreme.__name__ = reduce
    return extreme


traced_max = _traced_extreme("max", Maximum)
traced_min = _traced_extreme("min", Minimum)


def _edge_sets(iterable):
    if isinstance(iterable, Neighbours):
        return {iterable.edge_set}
    if isinstance(iterable, (list, tuple)):
        return {EDGE_SET[x.scope] for x in iterable if isinstance(x, Op) and x.scope in EDGE_SET}
    return set()


def traced_zip(*iterables, **kwargs):
    edge_sets = set().union(*(_edge_sets(it) for it in iterables))
    if len(edge_sets) > 1:
        raise TracingError(at_user_line(
            "zip pairs values over the same edges, but these lists run over "
            + " and ".join(EDGE_SET_TEXT[s] for s in sorted(edge_sets))))
    return _BUILTINS["zip"](*iterables, **kwargs)
