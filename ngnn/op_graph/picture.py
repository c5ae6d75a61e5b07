"""The IR as a picture: a snapshot of the op-graph after a pass, drawn with Graphviz.

A `Snapshot` records the structure the printer prints (names, op names, types, scopes,
arguments, fused groups) at the moment a pass finishes, because graph passes rewrite the
graph in place and the state after an early pass is gone by the end of `transform()`.
`to_dot` turns a snapshot into Graphviz source: every fused group is a cluster (a box)
around its ops, edge-scoped values are orange and node-scoped ones blue, and the values
kept in memory after fusion (edge values outside groups, group outputs) have a double
border. The `graphviz` package quotes the labels; Graphviz's `dot` program lays out and
renders png/svg/pdf. Both are optional (the `viz` extra) and imported only here.
"""
import functools
import os

from ..files import write_atomically
from .op import Constant, Op, Placeholder, Variable
from .printer import shown_steps, type_text

EDGE_SCOPES = ("e", "inedge", "outedge")
FILL = {"edge": "#fdd49e", "node": "#c6dbef", None: "#f0f0f0"}
FORMATS = ("dot", "svg", "png", "pdf")


class Value:
    """One op as drawn: `name` as in the IR text and its arguments' names, taken when the
    snapshot is; the rest is read from the op when drawn (passes change an op's arguments,
    through forwarding, but never its type or kind)."""

    def __init__(self, op, name, args, show_scope):
        self.op, self.name, self.args, self.show_scope = op, name, args, show_scope

    @functools.cached_property
    def op_name(self):
        return "constant" if isinstance(self.op, Constant) else self.op.op_name

    @property
    def type(self):
        return type_text(self.op, self.show_scope)

    @property
    def scope(self):
        """"edge", "node" or None (parameters and other unscoped values)."""
        scope = self.op.scope
        return "edge" if scope in EDGE_SCOPES else "node" if scope is not None else None

    @property
    def is_variable(self):
        return isinstance(self.op, Variable)

    @property
    def is_input(self):
        return isinstance(self.op, Placeholder) and not self.is_variable

    @functools.cached_property
    def scalar_constant(self):
        return isinstance(self.op, Constant) and self.op.value.ndim == 0

    @property
    def value_text(self):
        return f"{self.op.value.item():.4g}" if self.scalar_constant else None

    @property
    def is_assign(self):
        return self.op_name == "assign"


class Group:
    """A fused group as drawn: names of its ops, inputs, outputs and recomputed ops."""

    def __init__(self, step, names):
        self.name = step.name
        self.at = getattr(step, "at", None)
        self.ops = [names[op] for op in step.ops]
        self.outputs = {names[op] for op in step.outputs}
        self.recomputed = {names[op] for op in getattr(step, "recomputed", ())}


class Snapshot:
    """The op-graph's structure after one pass (see the module docstring)."""

    def __init__(self, title, steps, results, parameters, names):
        steps = shown_steps(steps)
        groups = [s for s in steps if not isinstance(s, Op)]
        ops = [s for s in steps if isinstance(s, Op)] + [op for g in groups for op in g.ops]
        show_scope = any(op.scope is not None for op in ops)
        self.title = title
        self.values = {}
        seen = set()
        for op in list(parameters) + ops:
            self._add(op, names, show_scope, seen)
        self.groups = [Group(g, names) for g in groups]
        self.results = [names[r] for r in results]
        self.variables = {op: names[op] for op in seen if isinstance(op, Variable)}

    def _add(self, op, names, show_scope, seen):
        stack = [op]
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            args = op.args
            name = names[op]
            self.values[name] = Value(op, name, [names[a] for a in args], show_scope)
            stack.extend(args)

    # ---- which values to draw ------------------------------------------------------------
    def ancestors(self, names):
        found, stack = set(), list(names)
        while stack:
            name = stack.pop()
            if name not in found:
                found.add(name)
                stack.extend(self.values[name].args)
        return found

    def forward(self):
        """Everything the non-assignment results (the loss, the logits) depend on."""
        return self.ancestors(r for r in self.results if not self.values[r].is_assign)

    def layer(self, variables):
        """The forward ops of the layer that owns `variables`: those that depend on one of
        them and on no variable that first enters the computation after them.

        A variable "enters before" when the ops that read the layer's variables already
        depend on it (the earlier layers' weights); the later layers' weights do not."""
        own = set()
        for var in variables:
            if var not in self.variables:
                raise ValueError(f"variable {getattr(var, 'name', var)!r} is not used by "
                                 f"this computation")
            own.add(self.variables[var])
        forward = self.forward()
        deps = self._variable_deps(forward)
        readers = [name for name in forward if own & set(self.values[name].args)]
        allowed = own.union(*(deps[name] for name in readers))
        return {name for name in forward if deps[name] & own and deps[name] <= allowed}

    def _variable_deps(self, names):
        """{name: the variables it depends on} for `names` and everything they read."""
        deps = {}
        for name in _post_order(names, self.values):
            value = self.values[name]
            deps[name] = set().union({name} if value.is_variable else set(),
                                     *(deps[a] for a in value.args))
        return deps


def _post_order(roots, values):
    """Names reachable from `roots`, each after all of its arguments."""
    order, done, stack = [], set(), [(root, False) for root in roots]
    while stack:
        name, expanded = stack.pop()
        if name in done:
            continue
        if expanded:
            done.add(name)
            order.append(name)
            continue
        stack.append((name, True))
        stack.extend((a, False) for a in values[name].args if a not in done)
    return order


# ---- Graphviz source -------------------------------------------------------------------

def to_dot(snapshot, collapse=False, forward=False, layer=None, title=None):
    """Graphviz source (a `graphviz.Digraph`) of a snapshot. `collapse` draws each fused
    group as one box; `forward` keeps the forward ops only; `layer` (a list of variables)
    keeps the forward ops of the layer that owns them."""
    graphviz = import_graphviz()
    keep = set(snapshot.values)
    if forward:
        keep = snapshot.forward()
    if layer is not None:
        keep = snapshot.layer(layer)
    keep = {n for n in keep if not snapshot.values[n].scalar_constant}
    dot = graphviz.Digraph(name=snapshot.title, graph_attr={
        "rankdir": "TB", "fontname": "Helvetica", "label": title or snapshot.title,
        "labelloc": "t", "newrank": "true"},
        node_attr={"fontname": "Helvetica", "fontsize": "10", "style": "filled"},
        edge_attr={"arrowsize": "0.6", "color": "#555555"})

    grouped = {}           # name of a core op -> its group
    for group in snapshot.groups:
        for name in group.ops:
            if name not in group.recomputed:
                grouped[name] = group
    # A group's recomputed copies belong to it, so it is drawn when its own ops are.
    drawn_groups = [g for g in snapshot.groups
                    if any(n in keep for n in g.ops if n not in g.recomputed)]

    def node_id(name, group=None):
        if group is not None and name in group.recomputed:
            return group.name if collapse else f"{group.name}/{name}"
        owner = grouped.get(name)
        if collapse and owner is not None:
            return owner.name
        return name

    # Values outside any group; the inputs a selection cut off are drawn faintly below.
    outside = [n for n in snapshot.values if n in keep and n not in grouped]
    for name in outside:
        # Outside groups every value has a buffer; only the edge-sized ones are notable.
        _value_node(dot, snapshot, name, name, stored=snapshot.values[name].scope == "edge")
    cut_inputs = set()
    for group in drawn_groups:
        if collapse:
            _collapsed_group(dot, group, snapshot)
        else:
            with dot.subgraph(name=f"cluster_{group.name}") as box:
                over = f"  (over {group.at} ends)" if group.at else ""
                box.attr(label=group.name + over, style="rounded,filled", fillcolor="#fffbe6",
                         color="#b8860b", fontname="Helvetica", fontsize="11", penwidth="1.5")
                for name in group.ops:
                    if name in keep:
                        _value_node(box, snapshot, name, node_id(name, group),
                                    stored=name in group.outputs and
                                    snapshot.values[name].scope == "edge",
                                    recomputed=name in group.recomputed)

    edges = set()

    def connect(arg, target_id, group=None):
        value = snapshot.values[arg]
        if value.scalar_constant:
            return
        if arg in keep:
            source_id = node_id(arg, group if group is not None and arg in group.ops else None)
        else:
            cut_inputs.add(arg)
            source_id = arg
        if source_id != target_id and (source_id, target_id) not in edges:
            edges.add((source_id, target_id))
            dot.edge(source_id, target_id)

    for name in outside:
        for arg in snapshot.values[name].args:
            connect(arg, name)
    for group in drawn_groups:
        for name in group.ops:
            if name in keep:
                for arg in snapshot.values[name].args:
                    connect(arg, node_id(name, group), group)
    for name in cut_inputs:
        value = snapshot.values[name]
        dot.node(name, f"{name}\n{value.type}", shape="note", fillcolor="#ffffff",
                 color="#aaaaaa", fontcolor="#777777")
    _legend(dot)
    return dot


def _value_node(graph, snapshot, name, node_id, stored, recomputed=False):
    value = snapshot.values[name]
    constants = [snapshot.values[a].value_text for a in value.args
                 if snapshot.values[a].scalar_constant]
    label = f"{name} = {value.op_name}" + (f"(…, {', '.join(constants)})" if constants else "")
    label += f"\n{value.type}"
    notes = ["stored"] if stored else []
    notes += ["recomputed"] if recomputed else []
    if notes:
        label += "\n" + ", ".join(notes)
    shape = "box" if value.is_variable else "parallelogram" if value.is_input else \
        "box" if value.is_assign else "ellipse"
    style = "filled,dashed" if recomputed else "filled,bold" if stored else "filled"
    graph.node(node_id, label, shape=shape, fillcolor=FILL[value.scope], style=style,
               peripheries="2" if stored else "1")


def _collapsed_group(dot, group, snapshot):
    stored = [n for n in group.outputs if snapshot.values[n].scope == "edge"]
    label = (f"{group.name}" + (f" over {group.at} ends" if group.at else "") +
             f"\n{len(group.ops)} ops" +
             (f", {len(group.recomputed)} recomputed" if group.recomputed else "") +
             f"\nout: {', '.join(sorted(group.outputs))}" +
             (f"\nstored: {', '.join(sorted(stored))}" if stored else ""))
    dot.node(group.name, label, shape="box3d", fillcolor="#fffbe6", color="#b8860b",
             peripheries="2" if stored else "1")


def _legend(dot):
    with dot.subgraph(name="legend") as legend:
        legend.attr(rank="sink")
        legend.node("legend", "<<table border='0' cellborder='1' cellspacing='0'>"
                    f"<tr><td bgcolor='{FILL['edge']}'>edge-scoped value</td></tr>"
                    f"<tr><td bgcolor='{FILL['node']}'>node-scoped value</td></tr>"
                    f"<tr><td bgcolor='{FILL[None]}'>parameter or global value</td></tr>"
                    "<tr><td>double border: edge value stored in memory</td></tr>"
                    "<tr><td>dashed: recomputed inside this group</td></tr>"
                    "<tr><td bgcolor='#fffbe6'>box: a fused group (one kernel)</td></tr>"
                    "</table>>", shape="plaintext", style="")


# ---- rendering -------------------------------------------------------------------------

def import_graphviz():
    try:
        import graphviz
    except ImportError as err:
        raise ImportError("drawing the IR needs the 'graphviz' Python package: "
                          "pip install 'ngnn[viz]' (and Graphviz's dot program)") from err
    return graphviz


def format_of(path, format=None):
    if format is None:
        format = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
        format = {"gv": "dot"}.get(format, format)
    if format not in FORMATS:
        raise ValueError(f"cannot draw to {os.fspath(path)!r}: the format must be one of "
                         f"{', '.join(FORMATS)} (given by format= or the file extension)")
    return format


def render(dot, path, format=None):
    """Writes `dot` to `path` as Graphviz source or a picture, atomically."""
    format = format_of(path, format)
    if format == "dot":
        data = dot.source.encode("utf-8")
    else:
        graphviz = import_graphviz()
        try:
            data = dot.pipe(format=format)
        except graphviz.ExecutableNotFound as err:
            raise RuntimeError(
                "drawing a picture needs Graphviz's 'dot' program, which is not on PATH: "
                "install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew "
                "install graphviz; https://graphviz.org/download/), or write the source "
                "with format 'dot'") from err
    write_atomically(path, data)
    return os.fspath(path)
