"""RowSweeps: which runs of row-wise ops the NumPy transformer's native mode runs as one C
loop (make_transformer("numpy", native=True); transformers/numpy/native_sweeps.py).

Between two matrix products a GNN layer's rows go through a chain of small row-wise ops:
a bias add, batch norm's statistics and its normalization, ReLU; backward, the ReLU mask,
its product with the gradient, batch norm's gradient terms. Each is one pass over a
(rows, F) tensor and one call from the generated Python; on a batch of small graphs the
calls and passes cost more than the arithmetic (docs/native.md). A sweep group runs such a
chain as passes over the rows that compute every op of the chain per element.

A group is a maximal run of consecutive steps of one (rows, F) shape, each either
  - an element-wise op with a C template (`op.c`) whose arguments are scalar constants,
    arrays the generated module binds once that broadcast to (rows, F) in its dtype, or
    (rows, F) values made earlier in the group; or
  - an op over live rows that says how it runs in a row loop (`row_phases`, batch
    norm's kernels: ngnn/op_graph/normalization.py), every group member with the same
    live-row count;
and at least two ops. The step order is kept, so the memory plan (made on that order)
holds for the group as it does for the ops one by one, given that the group reads
and writes each element of a (rows, F) value in that order; the writer checks, when it
binds the buffers, that no other overlap exists. The pass sets
`computation.row_sweeps` (a list of op lists) and rewrites nothing.
"""
from ..op_graph import Constant, ElementWise, Placeholder, Variable
from ..op_graph.normalization import LiveRowsOp
from .base import GraphPass
from .fusion import FusedGroup

FLOATS = ("float32", "float64")


class RowSweeps(GraphPass):
    def do_pass(self, computation):
        plan = computation.memory_plan
        groups, run = [], []

        def close():
            if len(run) >= 2:
                groups.append(list(run))
            run.clear()

        for step in computation.steps:
            if isinstance(step, (Constant, Placeholder, Variable)):
                continue        # leaves run nothing: bound once, or fed
            shape = None if isinstance(step, FusedGroup) else row_shape(step)
            if shape is not None and run and (row_shape(run[0]) != shape or
                                              not joins(step, run, plan)):
                close()
            if shape is not None and joins(step, run, plan):
                run.append(step)
            else:
                close()
        close()
        computation.row_sweeps = groups


def row_shape(op):
    """The (rows, F) an op runs over in a sweep, or None where it cannot join one."""
    if isinstance(op, LiveRowsOp) and op.row_phases:
        rows = op.args[op.row_args.index("x" if "x" in op.row_args else "delta")]
        # Two rows would read as batch norm's (2, F) statistics.
        return rows.shape if rows.shape[0] != 2 else None
    if isinstance(op, ElementWise) and op.c is not None and not op.is_view and \
            op.ndim == 2:
        return op.shape
    return None


def bound(op, plan):
    """Whether the generated module makes `op`'s array when it binds its buffers."""
    op = plan.into_variable.get(op, op)
    return isinstance(op, Variable) or op in plan.slots or \
        (isinstance(op, Constant) and op.value.ndim > 0)


def joins(op, run, plan):
    """Whether `op` can run in the sweep group `run` (its ops before it)."""
    if op.dtype.name not in FLOATS or not bound(op, plan):
        return False
    rows, features = row_shape(op)
    made = set(run)
    if isinstance(op, LiveRowsOp):
        live = op.live
        lives = {r.live for r in run if isinstance(r, LiveRowsOp)}
        if lives and lives != {live}:
            return False
        if live is not None and (live.dtype != op.dtype or live.size < 1 or
                                 not bound(live, plan) or live in made):
            return False
        shapes = {(rows, features), (2, features), (features,)}
        return all(a.dtype == op.dtype and a.shape in shapes and (a in made or bound(a, plan))
                   for a in op.args[:op.fixed_args])
    for a in op.args:
        if a.is_constant and a.value.ndim == 0:
            continue
        if a.dtype != op.dtype:
            return False
        if a in made:
            if a.shape != op.shape:
                return False
        elif not (bound(a, plan) and a.ndim <= 2 and
                  all(d in (1, o) for d, o in zip(a.shape[::-1], op.shape[::-1]))):
            return False
    return True
