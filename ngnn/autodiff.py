"""Reverse-mode differentiation over the op-graph: `ng.grad(y, x)`.

Each op states its own adjoint rule (`Op.adjoints`); this module only walks the graph
backwards, summing the contributions that reach each op.
"""
from .op_graph import Constant, Op, ordered_ops, zeros
from .op_graph.elementwise import Add
from .op_graph.layout import Concat, Reshape, Unslice


def grad(y, wrt, delta=None):
    """Gradient of `y` with respect to `wrt` (one op, or a list of ops -> list).

    `y` must be a scalar unless `delta`, the gradient flowing into `y`, is given.
    Ops that `y` does not depend on get a zero gradient.
    """
    single = isinstance(wrt, Op)
    targets = [wrt] if single else list(wrt)
    for t in targets:
        if not isinstance(t, Op):
            raise TypeError(f"grad: can only differentiate with respect to ops, got {t!r}")
    if not isinstance(y, Op):
        raise TypeError(f"grad: y must be an ngnn op, got {y!r}")
    traced = next((op for op in [y] + targets if op.zoom is not None), None)
    if traced is not None:
        from .errors import TracingError, at_user_line
        raise TracingError(at_user_line(
            f"ng.grad of the per-vertex value {traced} traced inside ng.zoomIn: gradients "
            "are taken of whole-graph tensors; call ng.grad after the context, on a loss "
            "built from ng.zoomOut(...)"))
    from .frontend import lower_zoom_outs
    lower_zoom_outs([y])     # gradients are defined on whole-graph ops (seed 000)
    y = y.forwarded
    if delta is None:
        if not y.is_scalar:
            raise ValueError(f"grad: y has shape {y.shape}; differentiate a scalar, or pass "
                             "the gradient of y as delta=")
        delta = Constant(1.0, dtype=y.dtype)
    elif not isinstance(delta, Op):
        delta = Constant(delta, dtype=y.dtype)
    if delta.shape != y.shape:
        raise ValueError(f"grad: delta has shape {delta.shape} but y has shape {y.shape}")

    targets = [t.forwarded for t in targets]
    for t in targets:
        if t.is_sparse:
            raise ValueError(f"grad: {t} is sparse; gradients are taken with respect to "
                             "dense tensors only (a sparse input is data, not a parameter)")
    order = ordered_ops([y])
    needed = _reaching(order, set(targets))
    contributions = {y: [delta]}
    for op in reversed(order):
        if op not in needed or op not in contributions:
            continue
        adjoint = _total(contributions[op])
        contributions[op] = [adjoint]
        if not op.args:
            continue
        for arg, g in zip(op.args, op.adjoints(adjoint)):
            if g is not None and arg in needed:
                contributions.setdefault(arg, []).append(g)
    grads = [_total(contributions[t]) if t in contributions else zeros(t.shape, t.dtype)
             for t in targets]
    return grads[0] if single else grads


def _reaching(order, targets):
    """Ops of `order` from which some target can be reached (the targets included)."""
    reach = set()
    for op in order:
        if op in targets or any(a in reach for a in op.args):
            reach.add(op)
    return reach


def _total(terms):
    terms = _rows_stacked(terms)
    total = terms[0]
    for t in terms[1:]:
        total = Add(total, t)
    return total


def _row_of(term):
    """r where `term` is the adjoint of x[r] (an Unslice filling one whole row of x), else
    None."""
    if not isinstance(term, Unslice) or not term.key or not isinstance(term.key[0], int):
        return None
    whole = all(isinstance(k, slice) and (k.start, k.stop, k.step) == (0, n, 1)
                for k, n in zip(term.key[1:], term.shape[1:]))
    return term.key[0] if whole else None


def _rows_stacked(terms):
    """The adjoints of x[0], x[1], ... (a per-relation weight read relation by relation,
    as R-GCN does) as one concatenation of their rows, zeros where a row is not read:
    summed one by one, each (a whole tensor, zero but in one row) would write all of x once
    per row (R-GCN on AIFB: 90 x 48 MB a step). Other terms are kept as they are."""
    groups = {}
    for term in terms:
        row = _row_of(term)
        if row is not None:
            groups.setdefault((term.shape, term.dtype), {}).setdefault(row, []).append(term)
    stacked, merged = [], set()
    for (shape, dtype), rows in groups.items():
        if sum(map(len, rows.values())) < 2:      # one row read once: nothing to merge
            continue
        pieces, r = [], 0
        while r < shape[0]:
            if r in rows:
                row_total = _total([term.args[0] for term in rows[r]])   # read more than once
                pieces.append(Reshape(row_total, (1,) + shape[1:]))
                r += 1
            else:
                end = next((i for i in range(r, shape[0]) if i in rows), shape[0])
                pieces.append(zeros((end - r,) + shape[1:], dtype))
                r = end
        stacked.append(Concat(*pieces, axis=0))
        merged.update(id(term) for row in rows.values() for term in row)
    return stacked + [t for t in terms if id(t) not in merged] if stacked else terms
