"""Type scopes (seed 000) and the rules that propagate them.

Traced per-vertex values (inside `ng.zoomIn`) are scoped `v` (the current vertex),
`innbs` / `outnbs` (a neighbour), `inedge` / `outedge` (an edge, printed `e`). After
operation batching, whole-graph tensors are scoped `n` (first axis: nodes) or `e` (first
axis: edges). Ordinary tensors and parameters have no scope (None), which fits any scope.
"""

LOCAL_SCOPES = ("v", "innbs", "outnbs", "inedge", "outedge")
EDGE_SET = {"innbs": "inedge", "inedge": "inedge", "outnbs": "outedge", "outedge": "outedge"}
PRINTED = {"inedge": "e", "outedge": "e"}


def combine_scopes(op_name, args):
    """(scope, zoom context) of an op built from `args`, by the seed's rules:
    same scope in, same scope out; different scopes meet on an edge."""
    scopes = {a.scope for a in args if a.scope is not None}
    zooms = {a.zoom for a in args if a.zoom is not None}
    if len(zooms) > 1:
        raise ValueError(f"{op_name}: values traced in two different ng.zoomIn contexts "
                         "cannot be combined; zoomOut one and pass it in as a node feature")
    zoom = next(iter(zooms), None)
    if zoom is not None:
        zoom.check_open()
    if not scopes:
        return None, zoom
    if len(scopes) == 1:
        return scopes.pop(), zoom
    local = scopes & set(LOCAL_SCOPES)
    if local and local != scopes:
        raise ValueError(f"{op_name}: a per-vertex value traced inside ng.zoomIn is combined "
                         "with a whole-graph tensor; pass the tensor to zoomIn as a node_feat "
                         "or edge_feat instead")
    if local:
        edge_sets = {EDGE_SET[s] for s in local if s in EDGE_SET}
        if len(edge_sets) > 1:
            raise ValueError(f"{op_name}: values over in-edges and over out-edges cannot be "
                             "combined (they are different edge sets)")
        return edge_sets.pop(), zoom
    return "e", zoom


def printed_scope(scope):
    return PRINTED.get(scope, scope)
