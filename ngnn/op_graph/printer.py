"""The IR as SSA text, in the style of seed 000:

    %el : n::Float32[N,8] = node::sum(%3, axis=(2,))

Type scopes and operator kinds are printed when the computation has graph values; node
and edge axes print as N and E.
"""
from .layout import format_index
from .op import Constant, Op, Placeholder, Variable
from .scopes import printed_scope


def type_text(op, show_scope):
    dims = [str(d) for d in op.shape]
    if show_scope and op.scope in ("n", "e") and dims:
        dims[0] = "N" if op.scope == "n" else "E"
    dtype = {"float32": "Float32", "float64": "Float64", "int64": "Int64", "int32": "Int32",
             "bool": "Bool"}.get(op.dtype.name, op.dtype.name)
    text = f"{dtype}[{','.join(dims)}]"
    if show_scope and op.scope:
        text = f"{printed_scope(op.scope)}::{text}"
    return text


def kind_of(op):
    if op.kind:
        return op.kind
    return "edge" if op.scope in ("e", "inedge", "outedge") else "node"


def attr_text(value):
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple) and any(isinstance(v, slice) for v in value):
        return format_index(value)
    if isinstance(value, tuple):
        return "(" + ",".join(attr_text(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if hasattr(value, "num_nodes"):
        return f"G{value.num_nodes}x{value.num_edges}"
    return str(value)


class IRNames:
    """%name for named ops, %0, %1, ... for the rest."""

    def __init__(self):
        from ..naming import Namer
        self.namer = Namer()
        self.names = {}
        self.counter = 0

    def __getitem__(self, op):
        if op not in self.names:
            if op.name:
                self.names[op] = self.namer(op.name)
            else:
                while str(self.counter) in self.namer.taken:
                    self.counter += 1
                self.names[op] = str(self.counter)
                self.namer.taken.add(self.names[op])
                self.counter += 1
        return "%" + self.names[op]


def call_text(op, names, show_scope=False):
    """`divide(%6, %7)`: the op applied to its arguments, as the IR writes it."""
    args = [names[a] for a in op.args]
    if isinstance(op, Constant) and op.value.ndim == 0:
        # In its own dtype's shortest digits, as generated code writes it: 0.1, not
        # 0.10000000149011612 (the float32 nearest 0.1, printed as a float64).
        args.append(f"value={str(op.value[()])}")
    else:
        args += [f"{k}={attr_text(v)}" for k, v in op.printed_attrs().items()]
    prefix = f"{kind_of(op)}::" if show_scope else ""
    name = "constant" if isinstance(op, Constant) else op.op_name
    return f"{prefix}{name}({', '.join(args)})"


def op_comment(op, names):
    """`%8 = divide(%6, %7)`: the IR's statement of `op` without types, as generated code
    comments the lines computing it."""
    return f"{names[op]} = {call_text(op, names)}"


def op_line(op, names, show_scope, indent="    "):
    return f"{indent}{names[op]} : {type_text(op, show_scope)} = {call_text(op, names, show_scope)}"


def shown_steps(steps):
    """Steps as the IR shows them: a group without a name (a GPU kernel that only inlines
    element-wise producers) is shown as its ops."""
    return [op for s in steps for op in
            (s.ops if not isinstance(s, Op) and s.name is None else [s])]


def format_ir(title, steps, results, parameters, names=None):
    """The graph as SSA text. `steps` are ops and fused groups (anything with `ops`,
    `inputs`, `outputs` and `name`); a group prints as a call, its body after the graph."""
    names = names or IRNames()
    steps = shown_steps(steps)
    groups = [s for s in steps if not isinstance(s, Op)]
    ops = [s for s in steps if isinstance(s, Op)] + [op for g in groups for op in g.ops]
    show_scope = any(op.scope is not None for op in ops)
    params = ", ".join(f"{names[p]} : {type_text(p, show_scope)}" for p in parameters)
    lines = [f"graph {title}({params}):"]
    for step in steps:
        if isinstance(step, Placeholder):
            continue
        if not isinstance(step, Op):
            outs = ", ".join(f"{names[o]} : {type_text(o, show_scope)}" for o in step.outputs)
            lines.append(f"    {outs} = {step.name}({', '.join(names[i] for i in step.inputs)})")
        elif isinstance(step, Variable):
            prefix = "prim::" if show_scope else ""
            lines.append(f"    {names[step]} : {type_text(step, show_scope)} = {prefix}variable()")
        else:
            lines.append(op_line(step, names, show_scope))
    lines.append("    return " + ", ".join(names[r] for r in results))
    for g in groups:
        params = ", ".join(f"{names[i]} : {type_text(i, show_scope)}" for i in g.inputs)
        where = f"  # over {g.at} ends" if g.at else ""
        lines += ["", f"{g.name}({params}):{where}"]
        recomputed = set(g.recomputed)
        for op in g.ops:
            note = "  # recomputed" if op in recomputed else \
                "  # materialized" if op in g.outputs and op.scope == "e" else ""
            lines.append(op_line(op, names, show_scope) + note)
        lines.append("    return " + ", ".join(names[o] for o in g.outputs))
    return "\n".join(lines)
