"""What a GPU computation's kernels did: `GPUComputation.kernel_report()`.

One row per kernel, in launch order, from the kernel plan (template, fused group, global
bytes), the prepared launches (count, work-groups, device time of the last call) and the
graph the kernel's edge loops walk (edges per work-group).
"""
import numpy as np


def edges_per_work_group(kernel):
    """The edges each work-group of one launch of `kernel` walks (an int64 array, one entry
    per work-group), or None for a kernel without an edge loop.

    From the launch geometry as the templates lay it out: a kernel with an edge loop binds
    the CSR offsets it walks (`in_indptr`, `out_indptr`), and each work-group covers a
    contiguous range of the rows the loop runs for, walking every edge of each row once:
    the row templates (aggregate, edge softmax, edge map) give a work-group `local_size[1]`
    vertices; a one-dimensional kernel over a node tensor (an element-wise root with the
    loop inlined) gives it the vertices of its `local_size[0]` elements, and one over an
    edge tensor the rows of its edges' ends."""
    loops = [(binding[1], binding[2]) for binding in kernel.bindings
             if binding[0] == "graph" and binding[2] in ("in_indptr", "out_indptr")]
    if not loops:
        return None
    graph = loops[0][0]
    walked = sum(np.diff(np.asarray(getattr(g, attribute), dtype=np.int64))
                 for g, attribute in loops)           # edges walked for each vertex's row
    if "rows" in kernel.fields:
        per_group = kernel.local_size[1]
        groups = kernel.global_size[1] // per_group
        return np.bincount(np.arange(graph.num_nodes) // per_group, weights=walked,
                           minlength=groups).astype(np.int64)
    if len(kernel.global_size) != 1 or not kernel.op.shape:
        return None
    rows = kernel.op.shape[0]
    if rows == graph.num_edges and kernel.op.scope == "e":
        # An edge's value walks the row of the end its loop is at.
        walked = sum(np.diff(np.asarray(getattr(graph, attribute), dtype=np.int64))[
            np.asarray(graph.dst if attribute == "in_indptr" else graph.src)]
            for _, attribute in loops)
    elif rows != graph.num_nodes:
        return None
    inner = max(kernel.op.size // max(rows, 1), 1)     # elements per row
    per_group = kernel.local_size[0]
    groups = kernel.global_size[0] // per_group
    start = np.arange(groups, dtype=np.int64) * per_group
    stop = np.minimum(start + per_group, kernel.op.size)
    first, last = start // inner, (stop - 1) // inner + 1
    total = np.concatenate([[0], np.cumsum(walked)])
    return np.where(stop > start, total[np.minimum(last, rows)] - total[np.minimum(first, rows)],
                    0)


def kernel_report(executor):
    """The rows of GPUComputation.kernel_report for a bound executor (GPUKernelGroup)."""
    launched = {}
    for kernel, launch in executor.launches:
        launched.setdefault(kernel, []).append(launch)
    rows = []
    for kernel in executor.kernels:
        launches = launched.get(kernel, [])
        groups = int(np.prod([g // s for g, s in zip(kernel.global_size, kernel.local_size)],
                             dtype=np.int64))
        edges = edges_per_work_group(kernel)
        times = [launch.seconds() for launch in launches] if executor.called else [None]
        rows.append({
            "name": kernel.name, "template": kernel.template,
            "group": executor.groups.get(kernel.op),
            "launches": len(launches), "work_groups": groups * len(launches),
            "max_edges": None if edges is None else int(edges.max(initial=0)),
            "mean_edges": None if edges is None else float(edges.mean()) if edges.size else 0.0,
            "global_bytes": kernel.global_bytes() * len(launches),
            "seconds": None if None in times else float(sum(times)),
        })
    return rows
