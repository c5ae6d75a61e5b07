"""Fusion (seed 000): edge ops and the aggregations that consume them become fused groups.

Greedy expansion from each edge op over the ordered ops, by the seed's rules:
  (0) consecutive element-wise ops in the same scope fuse;
  (1) an aggregation fuses with its upstream edge-scoped element-wise ops (and gathers);
  (2) an aggregation fuses with its downstream node-scoped element-wise ops.
A group runs over one end of the edges (destination-parallel over the in-CSR, or
source-parallel over the out-CSR for aggregations onto sources), so all its aggregations
and edge softmaxes share that end and graph; a gather of a value made inside the group
would need every vertex finished first, so it starts a new group. Groups never depend on
each other in a cycle.

The pass does not rewrite the graph: it records `computation.fusion_groups` and replaces
the group members in `computation.steps` (the execution order) by the groups.
"""
import heapq

from ..op_graph import Broadcast, Gather, Reshape
from .base import GraphPass


class FusedGroup:
    """A sub-graph run as one kernel: `ops` in order (recomputed ones included), `inputs`
    read from outside, `outputs` written for outside (the only edge-sized values stored)."""

    def __init__(self, index, graph, at):
        self.index = index
        self.graph, self.at = graph, at
        self.core = []            # ops computed here and nowhere else
        self.recomputed = []      # edge ops of other groups computed again here
        self.inputs, self.outputs = [], []
        self.merged_into = None

    @property
    def name(self):
        return f"fusedGraph{self.index}"

    @property
    def ops(self):
        members = set(self.core) | set(self.recomputed)
        return [op for op in self._order if op in members]

    def __repr__(self):
        return f"<{self.name} at {self.at}: {len(self.core)} ops>"


def edge_role(op, graph_of):
    """How `op` may take part in a group: "edge", "agg", "softmax", "node" or None (a
    graph op's own `fusion_role`; an op a group computes where its rows are by the rows
    it has)."""
    if op.fusion_role != "rows":
        return op.fusion_role
    if op.scope == "e" and op.shape and graph_of(op) is not None:
        return "edge"
    if op.scope == "n" and op.shape:
        return "node"
    return None


class Fusion(GraphPass):
    """Options: `recompute` (default True) lets a group recompute cheap edge values of other
    groups instead of reading them from memory; `max_recompute` bounds the ops recomputed
    for one value; `single_ops` keeps groups of one graph op (a lone op gains nothing from a
    group on NumPy, but a GPU program runs every graph op inside some group's kernels);
    `vertex_gathers` lets a group go on through a gather, at the group's own end, of a value
    it aggregated: that is the vertex's own value, known before its edge loop, so a whole
    attention (max, sum, weighted sum) becomes one group (the GPU's kernels compute such a
    value once per vertex, NumPy's blocks for the block's vertices), and leaves wide
    per-vertex values it would write for outside readers to those readers
    (`trim_wide_tails`)."""

    def __init__(self, recompute=True, max_recompute=16, single_ops=False,
                 vertex_gathers=False):
        self.recompute = recompute
        self.max_recompute = max_recompute
        self.single_ops = single_ops
        self.vertex_gathers = vertex_gathers

    def do_pass(self, computation):
        ops = computation.ordered_ops
        groups = form_groups(ops, self.single_ops, self.vertex_gathers)
        if self.vertex_gathers:
            for group in groups:
                trim_wide_tails(group, ops)
        if self.recompute:
            for group in groups:
                add_recompute(group, groups, self.max_recompute,
                              vertex_reads=self.vertex_gathers)
            for group in merge_siblings(groups):
                add_recompute(group, groups, self.max_recompute,
                              vertex_reads=self.vertex_gathers)
        recomputed_only = finish_groups(groups, ops, computation.results)
        computation.fusion_groups = groups
        computation.steps = schedule([op for op in ops if op not in recomputed_only], groups)


def form_groups(ops, single_ops=False, vertex_gathers=False):
    graph_of = _graph_finder(ops)
    group_of = {}
    groups = []
    depends = {}          # op -> set of groups it (transitively) reads from

    def canonical(g):
        while g.merged_into is not None:
            g = g.merged_into
        return g

    def deps(op):
        return {canonical(g) for g in depends.get(op, ())}

    for op in ops:
        role = edge_role(op, graph_of)
        arg_deps = set()
        for a in op.args:
            arg_deps |= deps(a)
            if a in group_of:
                arg_deps.add(canonical(group_of[a]))
        depends[op] = arg_deps
        if role is None:
            continue
        graph = graph_of(op)
        at = getattr(op, "at", None)
        candidates = []
        for a in op.args:
            if a in group_of and (_fusable_pair(a, op, role) or vertex_gathers and
                                  _gathers_own_vertex(a, op, canonical(group_of[a]))):
                g = canonical(group_of[a])
                if g not in candidates:
                    candidates.append(g)
        if len({id(g.graph) for g in candidates}) > 1:
            # Groups over different graphs cannot merge: join the newest, so a running sum
            # of terms over several graphs (R-GCN's relations) is added to term by term, and
            # the first group does not wait for, and keep alive, every other term.
            candidates.sort(key=lambda g: -g.index)
            if role == "node":       # a per-vertex op runs after any graph's edge loop
                graph = candidates[0].graph
        target = None
        for g in candidates:
            if target is None:
                if _compatible(g, graph, at, op, group_of, canonical) and \
                        not _reaches_through_outside(op, g, group_of, depends, canonical):
                    target = g
            elif _compatible(g, target.graph, target.at, op, group_of, canonical) and \
                    (g.at is None or target.at is None or g.at == target.at) and \
                    not _reaches_through_outside(op, g, group_of, depends, canonical) and \
                    g not in _group_deps(target, depends, canonical) and \
                    target not in _group_deps(g, depends, canonical):
                _merge(target, g)
        if target is None:
            if role == "node":
                continue            # node ops only join groups an aggregation opened
            target = FusedGroup(len(groups) + 1, graph, None)
            groups.append(target)
        if at is not None and role in ("agg", "softmax"):
            target.at = target.at or at
        target.core.append(op)
        group_of[op] = target
        depends[op] = {g for g in arg_deps if g is not target}
    live = [g for g in groups if g.merged_into is None and (single_ops or len(g.core) > 1)]
    for i, g in enumerate(live, 1):
        g.index = i
        g.at = g.at or "dst"
    return live


def trim_wide_tails(group, ops):
    """Leaves out of `group` the per-vertex ops after its aggregations whose values go
    only outside it and are wider than the group's values they derive from (a per-head
    gradient broadcast over each head's features, times the features or a weight: the
    gradients of GAT's attention vectors and their share of the features' gradient). A GPU
    group would write the wide value and its readers read it back; left out, each reader
    computes it in registers from the narrow value (KernelPlanning inlines it), which the
    group writes instead. A tail op stays where an op staying in the group reads it (no
    group may wait on an op that waits on it), and so does one reading a per-vertex op
    that stays (which it would make a wide output)."""
    core = set(group.core)
    graph_of = _graph_finder(ops)
    users = {}
    for op in ops:
        for a in op.args:
            users.setdefault(a, []).append(op)

    def tail_of(out):
        """(per-vertex ops computing `out` from the group's other values, those values)."""
        tail, roots, stack = set(), set(), [out]
        while stack:
            x = stack.pop()
            if x in tail or x in roots or x not in core:
                continue
            if x.scope == "n" and edge_role(x, graph_of) == "node":
                tail.add(x)
                stack.extend(x.args)
            else:
                roots.add(x)
        return tail, roots

    trimmed = set()
    for out in group.core:
        if out.scope != "n" or not any(u not in core for u in users.get(out, ())):
            continue
        tail, roots = tail_of(out)
        if roots and out in tail and out.size > max(r.size for r in roots):
            trimmed |= tail
    changed = True
    while changed:
        staying = core - trimmed
        keep = {x for x in trimmed
                if any(u in staying for u in users.get(x, ())) or
                any(a in staying and edge_role(a, graph_of) == "node" for a in x.args)}
        changed = bool(keep)
        trimmed -= keep
    group.core = [op for op in group.core if op not in trimmed]


def _fusable_pair(producer, consumer, role):
    """Rules (0)-(2): may `consumer` join the group of its argument `producer`?"""
    if isinstance(consumer, Gather):
        return False                       # needs the whole node tensor first
    if role == "node":
        return producer.scope == "n"       # rule (2): after an aggregation
    return producer.scope == "e"           # rules (0) and (1)


def _gathers_own_vertex(producer, gather, group):
    return isinstance(gather, Gather) and producer.scope == "n" and \
        group.graph is gather.graph and group.at == gather.by


def _compatible(group, graph, at, op, group_of, canonical):
    if group.graph is not None and graph is not None and group.graph is not graph:
        return False
    return not (at is not None and group.at is not None and at != group.at and
                op.fusion_role in ("agg", "softmax"))


def _reaches_through_outside(op, group, group_of, depends, canonical):
    """Does some argument of `op` that is outside `group` depend on `group`? Then fusing
    `op` into it would make the group wait on itself."""
    for a in op.args:
        if a in group_of and canonical(group_of[a]) is group:
            continue
        if group in {canonical(g) for g in depends.get(a, ())} or \
                a in group_of and canonical(group_of[a]) is group:
            return True
    return False


def _group_deps(group, depends, canonical):
    out = set()
    for op in group.core:
        out |= {canonical(g) for g in depends.get(op, ())}
    out.discard(group)
    return out


def _merge(into, other):
    into.core.extend(other.core)
    into.at = into.at or other.at
    other.merged_into = into
    other.core = []


def _graph_finder(ops):
    """The graph an edge-scoped value runs over (inherited from its arguments; an edge
    value made from edge inputs alone, a user's edge features cast or reshaped, takes the
    graph of the edge values it is combined with: its rows are their edges)."""
    graph = {}
    for op in ops:
        g = getattr(op, "graph", None)
        if g is None:
            g = next((graph[a] for a in op.args if graph.get(a) is not None), None)
        graph[op] = g
    for op in reversed(ops):
        for a in op.args:
            if a.scope == "e" and graph.get(a) is None and graph.get(op) is not None and \
                    op.scope == "e" and a.shape[:1] == op.shape[:1] and \
                    not isinstance(a, (Reshape, Broadcast)):    # views stay views
                graph[a] = graph[op]
    return graph.get


def add_recompute(group, groups, limit, vertex_reads=False):
    """Edge values this group reads from other groups are recomputed here when their
    edge-side ancestry is short, made only of gathers and element-wise ops, and nowhere
    wider than the value itself: recomputing then reads no more per edge than loading the
    stored value would (GAT's attention logits, (E, H, 1) from (N, H, 1) gathers, are
    recomputed; a per-head dot product over gathered (E, H, F) features is stored). When the
    whole ancestry cannot be recomputed, an edge value of it that is narrower than the
    recomputed one is read instead, stored by its group (GAT's backward with attention
    dropout recomputes alpha * gathered gradient, (E, H, F), from the stored dropped
    (E, H, 1) attention instead of storing the product); without dropout the attention
    itself is recomputed and nothing is stored (docs/fusion.md: E x H floats less).

    With `vertex_reads` (a group computes a gather by its own end once per vertex, before
    the edge loop), only what the recomputation reads per edge counts against its width:
    wider values computed in registers are free, and so are gathers by the group's own end
    and gathers the group already reads. So the source-side group of an attention's
    backward recomputes the gradient of the logits, a per-head dot product of the
    destination's gradient (which it reads anyway) with its own features, instead of
    reading it stored (E x heads) from the destination-side group. This is the one rule
    for what is recomputed (docs/fusion.md, "What an attention's training step stores"):
    a value whose recomputation loads per edge only rows the walk loads anyway, or rows
    no wider than the value, costs no more than storing it and reading it back."""
    core = set(group.core)
    owner = {op: g for g in groups for op in g.core}
    extra = []

    def read_from_others(ops):
        return [a for op in ops for a in op.args
                if a not in core and a not in extra and owner.get(a) is not None and
                a.scope == "e"]

    wanted = list(dict.fromkeys(read_from_others(group.core)))
    free = FreeReads(group, core, extra) if vertex_reads else None
    while True:
        made = len(extra)
        if vertex_reads:
            # Whole chains first, until none is added: each one added makes more reads
            # free for the others (the order of the group's ops does not decide).
            progress = True
            while progress:
                progress = False
                for a in wanted:
                    if a not in extra:
                        chain = _chain(a, owner, limit, group.graph, False, free)
                        if chain is not None:
                            extra.extend(c for c in chain if c not in extra and c not in core)
                            progress = True
        for a in wanted:
            if a not in extra:
                chain = _recompute_chain(a, owner, limit, group.graph, free)
                if chain is not None:
                    extra.extend(c for c in chain if c not in extra and c not in core)
        if len(extra) == made:
            break
        # A chain that reads narrower values of its ancestry (too long to recompute whole)
        # reads them from their group: each is a value wanted in its own right, recomputed
        # when its own chain is within the limit (GATv2's source-side backward: the
        # gradient of its messages reads the attention and the logits' gradient). And
        # what is recomputed now is present for the values tried before (not counted in
        # the limit), so they are tried again.
        wanted += [a for a in dict.fromkeys(read_from_others(extra)) if a not in wanted]
    group.recomputed = extra


def merge_siblings(groups):
    """Groups over the same graph and end that gather the same node value by their other
    end, neither waiting on the other, become one walk: it reads each of those rows once
    (TransformerConv's backward: the gradients of keys and of values both read the
    query of each edge's destination). Edits `groups` in place; returns the merged ones,
    whose recomputation is chosen again (their reads are the union of both)."""
    merged = []
    for i, group in enumerate(groups):
        if group.merged_into is not None:
            continue
        for other in groups[i + 1:]:
            if other.merged_into is None and other.graph is group.graph and \
                    other.at == group.at and _gathers_by_other_end(group) & \
                    _gathers_by_other_end(other) and \
                    not _waits_on(group, other, groups) and \
                    not _waits_on(other, group, groups):
                _merge(group, other)
                group.recomputed = []
                if group not in merged:
                    merged.append(group)
    groups[:] = [g for g in groups if g.merged_into is None]
    for i, g in enumerate(groups, 1):
        g.index = i
    return merged


def _gathers_by_other_end(group):
    return {op.args[0] for op in group.core + group.recomputed
            if isinstance(op, Gather) and op.by != group.at}


def _waits_on(group, other, groups):
    """Does `group` wait on `other`, through any chain of ops and groups? (A group runs
    after every group any of its members' arguments come from.)"""
    member_of = {op: g for g in groups for op in g.core}

    def needs(node):
        if isinstance(node, FusedGroup):
            members = set(node.core) | set(node.recomputed)
            return {member_of.get(a, a) for op in members for a in op.args
                    if a not in members}
        return {member_of.get(a, a) for a in node.args}

    seen, stack = {group}, [group]
    while stack:
        for before in needs(stack.pop()):
            if before is other:
                return True
            if before not in seen:
                seen.add(before)
                stack.append(before)
    return False


def _recompute_chain(op, owner, limit, graph, free=None):
    return _chain(op, owner, limit, graph, read_narrower=False, free=free) or \
        _chain(op, owner, limit, graph, read_narrower=True, free=free)


class FreeReads:
    """`free(x)`: whether an edge value wider than the one recomputed costs `group` no
    extra read per edge beyond what its walk pays anyway: computed in registers, a gather
    by the group's own end (read once per vertex) or one the group computes already, a
    read of an edge input whose rows the group reads already, or a row of the edge's other
    end (a gather, or an edge input's row) no wider than a row the group's own ops gather
    by that end: the walk goes to that vertex for each edge anyway, and reading a second
    row at most doubles what it reads there, while storing the value keeps an E-sized
    buffer alive between the walks (TransformerConv's backward with edge features).
    `present(x)`: computed by the group already, so recomputing it again costs nothing
    (not counted in the limit)."""

    def __init__(self, group, core, extra):
        self.at, self.core, self.extra = group.at, core, extra

    def present(self, x):
        return x in self.core or x in self.extra

    def __call__(self, x):
        if isinstance(x, Gather):
            return x.by == self.at or self.present(x) or x.size <= self.widest_row
        # A value read straight from an edge input (a user's edge features) loads a row per
        # edge, as a gather by the other end does, unless the group reads those rows already.
        inputs = [a for a in x.args if _edge_input(a, x.shape[:1])]
        if inputs:
            return self.present(x) or all(self.reads(a) or a.size <= self.widest_row
                                          for a in inputs)
        return True

    @property
    def widest_row(self):
        """The size of the widest row the group gathers by the edges' other end."""
        return max((x.size for x in (*self.core, *self.extra)
                    if isinstance(x, Gather) and x.by != self.at), default=0)

    def reads(self, a):
        """Does the group read `a` already?"""
        return any(a in op.args for op in (*self.core, *self.extra))


def _edge_input(x, rows):
    """Is `x` an input with `rows` rows, or a reshaped view of one?"""
    while isinstance(x, (Reshape, Broadcast)):
        x = x.args[0]
    return not x.args and x.shape[:1] == rows


def _chain(op, owner, limit, graph, read_narrower, free=None):
    """The ops recomputing `op` in a group over `graph`, or None; `read_narrower`: edge
    values of the ancestry narrower than `op` are read, not recomputed; `free(x)`: x may
    be wider than `op` (FreeReads)."""
    chain, stack = [], [op]
    while stack:
        x = stack.pop()
        if x in chain:
            continue
        if not (x.fusion_role in ("edge", "rows") and x.scope == "e") or \
                x.size > op.size and not (free and free(x)):
            return None
        if isinstance(x, Gather) and x.graph is not graph:
            return None      # the group walks its own graph's edges (a typed graph's
            #                  derived graphs have the same edges in another order)
        chain.append(x)
        new = sum(not free.present(c) for c in chain) if free else len(chain)
        if new > limit:
            return None
        if not isinstance(x, Gather):
            stack.extend(a for a in x.args if a.scope == "e" and owner.get(a) is not None
                         and (not read_narrower or a.size >= op.size or isinstance(a, Gather)))
            if any(a.scope == "e" and owner.get(a) is None and not isinstance(a, Gather)
                   and not _edge_input(a, x.shape[:1]) for a in x.args):
                return None
    return chain


def finish_groups(groups, ops, results):
    """Inputs and outputs of each group; returns the ops that only recomputation needs."""
    order = {op: i for i, op in enumerate(ops)}
    result_set = set(results)
    users = {}
    for op in ops:
        for a in op.args:
            users.setdefault(a, []).append(op)
    for g in groups:
        g._order = sorted(set(g.core) | set(g.recomputed), key=order.__getitem__)
    covered = {}                     # op -> groups that compute it
    for g in groups:
        for op in g._order:
            covered.setdefault(op, set()).add(g)
    for g in groups:
        members = set(g._order)
        inputs = []
        for op in g._order:
            for a in op.args:
                if a not in members and a not in inputs:
                    inputs.append(a)
        g.inputs = inputs
        g.outputs = [op for op in g.core
                     if op in result_set or any(u not in members and
                                                not _recomputes(u, op, covered)
                                                for u in users.get(op, ()))]
    # A group recomputing a gather of a value another group made inside itself (a vertex
    # gather) reads that value: it must be stored, so it is an output there too.
    owner = {op: g for g in groups for op in g.core}
    for g in groups:
        for a in g.inputs:
            home = owner.get(a)
            if home is not None and home is not g and a not in home.outputs:
                home.outputs = [op for op in home.core if op in home.outputs or op is a]
    return {op for g in groups for op in _drop_dead(g, users)}


def _drop_dead(group, users):
    """Core ops whose every user recomputes them elsewhere need not run here (nor
    anywhere else on their own). Returns them."""
    dropped = []
    while True:
        members = set(group._order)
        dead = [op for op in group.core if op not in group.outputs and
                not any(u in members for u in users.get(op, ()))]
        if not dead:
            return dropped
        dropped += dead
        group.core = [op for op in group.core if op not in dead]
        group._order = [op for op in group._order if op not in dead]
        group.inputs = [a for a in group.inputs
                        if any(a in op.args for op in group._order)]


def _recomputes(user, op, covered):
    """Is every group that computes `user` also recomputing `op` itself?"""
    groups = covered.get(user)
    return bool(groups) and all(op in g._order for g in groups)


def schedule(ops, groups):
    """Execution order of plain ops and groups: a topological order of the graph where
    each group is one node, kept as close to the original op order as possible."""
    member_of = {op: g for g in groups for op in g.core}
    position = {op: i for i, op in enumerate(ops)}
    nodes = [op for op in ops if op not in member_of] + list(groups)
    rank = {n: min(position[op] for op in n.core) if isinstance(n, FusedGroup)
            else position[n] for n in nodes}

    def producer(op):
        return member_of.get(op, op)

    needs = {n: {producer(a) for a in (n.inputs if isinstance(n, FusedGroup) else n.args)}
             for n in nodes}
    users = {}
    for n, deps in needs.items():
        deps.discard(n)
        for d in deps:
            users.setdefault(d, []).append(n)
    index = {n: i for i, n in enumerate(nodes)}
    ready = [(rank[n], index[n], n) for n in nodes if not needs[n]]
    heapq.heapify(ready)
    steps = []
    while ready:
        _, _, n = heapq.heappop(ready)
        steps.append(n)
        for u in users.get(n, ()):
            needs[u].discard(n)
            if not needs[u]:
                heapq.heappush(ready, (rank[u], index[u], u))
    if len(steps) != len(nodes):
        raise RuntimeError("fusion produced groups that depend on each other in a cycle")
    return steps


__all__ = ["Fusion", "FusedGroup"]
