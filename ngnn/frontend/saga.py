"""SAGA-NN (seed 003, NeuGraph): a GNN layer as Scatter, ApplyEdge, Gather, ApplyVertex.

    out = ng.saga(g, node_feat={"h": h},
                  apply_edge=lambda src, dst, edge: src.h * edge.w,
                  accumulator="sum",
                  apply_vertex=lambda v, acc: ng.relu(ng.dot(acc, W)),
                  edge_feat={"w": w})

Scatter and Gather are not user code: Scatter hands each in-edge its source's and its
destination's vertex data (`src`, `dst`) and its own edge data (`edge`), Gather reduces
ApplyEdge's per-edge values at the destination with the named accumulator. The stages are
traced as one `ng.zoomIn` program over the in-edges,

    with ng.zoomIn(g, node_feat=..., edge_feat=...) as v:
        acc = <accumulator>([apply_edge(n, v, e) for n, e in zip(v.innbs, v.inedges)])
        out = apply_vertex(v, acc)

so a SAGA-NN layer is the same op-graph as that code: it batches, fuses, differentiates and
runs on every transformer exactly like the vertex-centric front end.
"""
import difflib

from ..errors import TracingError, at_user_line
from ..op_graph import Op
from ..op_graph.scopes import EDGE_SET
from .tracing import LocalAggregate, Neighbour, ZoomContext, _Proxy, zoomOut

ACCUMULATORS = ("sum", "mean", "max", "min")


def saga(graph, node_feat=None, apply_edge=None, accumulator="sum", apply_vertex=None,
         edge_feat=None):
    """One SAGA-NN layer over the in-edges of `graph`; returns the new vertex data as a node
    tensor (a tuple of them if `apply_vertex` returns several values).

    `node_feat` / `edge_feat`: {name: tensor} dicts (or lists of named tensors), one row per
    node / per edge. `apply_edge(src, dst, edge)` returns one value per edge, built from
    `src.<node feature>`, `dst.<node feature>`, `edge.<edge feature>` (and `src.outdegree`,
    `dst.indegree`, ...) with ordinary ops; parameters keep their full shapes.
    `accumulator` ("sum", "mean", "max" or "min") reduces those values at each destination;
    a vertex without in-edges gets 0. `apply_vertex(vertex, accum)` returns the new data of
    a vertex from its own features (`vertex.h`) and the accumulated value; by default the
    accumulated value itself."""
    if not callable(apply_edge):
        raise TypeError(f"ng.saga: apply_edge must be a function (src, dst, edge) -> per-edge "
                        f"value, got {apply_edge!r}")
    if apply_vertex is not None and not callable(apply_vertex):
        raise TypeError(f"ng.saga: apply_vertex must be a function (vertex, accum) -> new "
                        f"vertex data, or None, got {apply_vertex!r}")
    if accumulator not in ACCUMULATORS:
        close = difflib.get_close_matches(str(accumulator).lower(), ACCUMULATORS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"ng.saga: unknown accumulator {accumulator!r}{hint}; accumulators: "
                         f"{', '.join(ACCUMULATORS)}")
    context = ZoomContext(graph, node_feat, edge_feat, caller="ng.saga")
    with context:
        src = Neighbour(context, "innbs", "node", "src")
        dst = Neighbour(context, "v", "node", "dst")
        edge = _Proxy(context, "inedge", "edge", "edge")
        message = _edge_value(apply_edge(src, dst, edge), context)
        accum = LocalAggregate(message, accumulator)
        if apply_vertex is None:
            return zoomOut(accum)
        vertex = Neighbour(context, "v", "node", "vertex")
        new = apply_vertex(vertex, accum)
        values = list(new) if isinstance(new, (list, tuple)) else [new]
        return zoomOut(*(_vertex_value(value, context) for value in values))


def _edge_value(value, context):
    """`value` if apply_edge returned one value per edge, else an error saying what it was."""
    problem = _not_traced(value, context, "reads no src, dst or edge data of this ng.saga")
    if problem is None and value.scope not in EDGE_SET:
        problem = (f"returned {value!r}, one value per destination vertex: it reads only dst, "
                   "so every edge into a vertex would carry the same value")
    if problem is None:
        return value
    raise TracingError(at_user_line(
        f"ng.saga: apply_edge {problem}; it must return one value per edge, built from "
        "src.<feature> or edge.<feature> (and dst.<feature> if needed), e.g. src.h * edge.w"))


def _vertex_value(value, context):
    """`value` if apply_vertex returned per-vertex data, else an error saying what it was."""
    problem = _not_traced(value, context, "reads neither the vertex nor the accumulated value")
    if problem is None and value.scope != "v":
        problem = f"returned {value!r}, which has one value per edge, not per vertex"
    if problem is None:
        return value
    raise TracingError(at_user_line(
        f"ng.saga: apply_vertex {problem}; it must return the new vertex data, built from "
        "accum and vertex.<feature>, e.g. ng.relu(ng.dot(accum, W))"))


def _not_traced(value, context, reads_nothing):
    """What is wrong with a returned value that is no tensor of this ng.saga, or None."""
    if value is None:
        return "returned None (a missing `return`?)"
    if not isinstance(value, Op):
        return f"returned {value!r}, which is not a tensor"
    if value.zoom is not context:
        return f"returned {value!r}, which {reads_nothing}"
    return None
