"""One name per value: the IR's `%8` is `t_8` in the generated NumPy module (its block rows
`b_8`, their workspace array `w_8`), `%8` in the memory plan and the simulator's report; every
statement says which op it computes (`# %8 = divide(%6, %7)`), recomputed ones say so, and
scalar constants are literals (ngnn/naming.py)."""
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import nn, simulate
from ngnn import transformers as ngt
from ngnn.cli import make_parser
from ngnn.naming import value_identifier
from ngnn.op_graph import Constant, Multiply
from ngnn.recipes import fill_defaults, load_dataset, make_trainer
from ngnn.transformers.numpy.codegen import is_scalar_constant

# Lines that name or lay out values rather than compute one: bindings of views into the
# memory plan's buffers, workspace arrays and block rows, a block's edge ids and bounds, the
# stores of block rows into stored values, and the module's own frame.
STRUCTURE = [r"", r'""".*"""', r"import .*", r"from .* import .*", r"def \w+\(.*\):",
             r"return .*", r"# \d+ ops, .*", r"for v0, v1, p0, p1 in K\.blocks\(.*\):",
             r"workspace = np\.empty\(.*", r"g\d+ = graphs\[\d+\]", r"exchange\d+ = graphs\[\d+\]",
             r"t_\w+ = variables\[\d+\]", r"t_\w+ = K\.view\(buffers\[\d+\], .*\)",
             r"w_\w+ = K\.view\(workspace\[\d+:\], .*\)", r"w[hcf]_\w+ = K\.view\(workspace.*\)",
             r"np\.copyto\(w[cf]_\w+, t_\w+(\.transpose\(.*\))?\)  # the rows of %\w+\b.*",
             r"(eids|src|dst|seg|in_csr|in_pos|(dst|src)_in_block) = .*", r"(n_e|n_v)(, n_v)? = .*",
             r"b_\w+ = (w_\w+\[:n_[ev]\]|t_\w+\[v0:v1\]|K\.block_array\(w_\w+, n_[ev]\))",
             r"t_\w+\[(v0:v1|eids|p0:p1|in_pos)\] = b_\w+",
             r"h_\w+ = K\.by_head\(t_\w+, \d+, wh_\w+\)",
             r"(t_\w+) = np\.ascontiguousarray\(\1\)",
             r"k_\w+ = K\.dropout_keep.*  # keep bits of %\w+"]


def gat_training_step(transformer):
    """One training step of a GATConv layer with attention dropout: loss, gradients and SGD
    updates, fused (the recomputing attention groups of docs/overview.md)."""
    rng = np.random.default_rng(0)
    n = 30
    g = ng.Graph.from_edges(rng.integers(0, n, 120), rng.integers(0, n, 120), n)
    layer = nn.GATConv(4, 3, 2, attn_drop=0.5, seed=0)
    x = ng.placeholder((n, 4), name="x")
    out = layer(g, x, training=True)
    loss = ng.sum(out * out)
    params = layer.parameters()
    updates = [ng.assign(p, p - 0.1 * d) for p, d in zip(params, ng.grad(loss, params))]
    comp = transformer.computation([loss] + updates, x)
    comp(rng.normal(size=(n, 4)).astype(np.float32))
    return comp


def transformer_conv_training_step(transformer):
    """One training step of a TransformerConv layer with edge features: its groups copy
    per-vertex tables once per call and sum edge-feature products in place (fused.py)."""
    rng = np.random.default_rng(0)
    n = 30
    g = ng.Graph.from_edges(rng.integers(0, n, 120), rng.integers(0, n, 120), n)
    layer = nn.TransformerConv(4, 3, 2, edge_dim=3, seed=0)
    x = ng.placeholder((n, 4), name="x")
    e = ng.placeholder((120, 3), name="e")
    loss = ng.sum(layer(g, x, e, training=True) ** 2)
    params = layer.parameters()
    updates = [ng.assign(p, p - 0.1 * d) for p, d in zip(params, ng.grad(loss, params))]
    comp = transformer.computation([loss] + updates, x, e)
    comp(rng.normal(size=(n, 4)).astype(np.float32), rng.normal(size=(120, 3)).astype(np.float32))
    return comp


def recipe_gat_training_step(transformer):
    """The training step `ngnn train --model gat` runs (two GATConv layers, feature and
    attention dropout, cross-entropy, Adam), on a small SBM graph."""
    args = make_parser().parse_args(["bench", "--model", "gat", "--dataset", "sbm",
                                     "--num-nodes", "200", "--num-classes", "3"])
    fill_defaults(args)
    trainer = make_trainer(args, load_dataset(args), 0, transformer=transformer)
    trainer.step()
    return trainer.train_step


def written_value(line):
    """The identifier a statement writes: what it assigns, its `out=` array, the array
    np.copyto fills, or the array it fills or sets items of."""
    for pattern in (r"([A-Za-z_]\w*) = ", r".*out=([A-Za-z_]\w*)", r"np\.copyto\((\w+), ",
                    r"(\w+)(\.fill\(|\[.*\] = )"):
        match = re.match(pattern, line)
        if match:
            return match.group(1)
    raise AssertionError(f"writes no value: {line}")


def ir_name(identifier):
    """`t_8` or `b_8` -> `%8` (ngnn.naming.value_identifier, backwards)."""
    role, _, rest = identifier.partition("_")
    assert role in ("t", "b"), identifier
    return "%" + rest


@pytest.mark.parametrize("build", [gat_training_step, recipe_gat_training_step,
                                   transformer_conv_training_step])
def test_every_statement_of_a_gat_training_step_names_its_value_and_op(build):
    with ngt.make_transformer("numpy") as t:
        comp = build(t)
        source, ir = comp.source, comp.ir
    assert comp.fusion_groups
    ir_statements = set(re.findall(r"^\s+(%\w+) : ", ir, flags=re.M))
    groups = {group.name: group for group in comp.fusion_groups}
    commented = 0
    for line in source.splitlines():
        code, _, comment = line.strip().partition("  # ")
        if comment.startswith("%"):
            commented += 1
            names, _, call = comment.partition(" = ")
            assert re.match(r"\w+\(", call), line
            if call.startswith("fusedGraph"):       # a group: `%8, %9 = fusedGraph3(...)`
                group = groups[re.match(r"(\w+)\(", code).group(1)]
                assert names == ", ".join(comp.value_names[o] for o in group.outputs), line
                continue
            written = written_value(code)
            # Where the value lands: its own array, or the variable an assignment (or a
            # value the memory plan computes in place of the variable) writes.
            into = re.search(r"# into (%\w+)", comment) or re.match(r"assign\((%\w+)", call)
            assert names in ir_statements, line
            assert ir_name(written) == (into.group(1) if into else names), line
        else:
            assert any(re.fullmatch(p, line.strip()) for p in STRUCTURE), line
    assert commented > 80       # 92 since the NumPy groups make their vertex gathers (e31b)


def group_lines(source, group):
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"def {group}("))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * 8))
    return lines[start:end]


def test_recomputed_statements_say_so():
    with ngt.make_transformer("numpy") as t:
        comp = gat_training_step(t)
        source, names = comp.source, comp.value_names
    seen = 0
    for group in comp.fusion_groups:
        lines = group_lines(source, group.name)
        for op in group.ops:
            line = next((line for line in lines if f"  # {names[op]} = " in line), None)
            if line is None:            # run inside a sparse product (fused.py)
                continue
            seen += op in group.recomputed
            assert line.endswith("  # recomputed") == (op in group.recomputed), line
    assert seen >= 20      # GAT's attention scores, recomputed in each later group


def test_scalar_constants_are_literals():
    with ngt.make_transformer("numpy") as t:
        comp = gat_training_step(t)
        source = comp.source
    constants = [op for op in comp.ordered_ops if is_scalar_constant(op)]
    assert len(constants) >= 4                 # leaky_relu's gradient (0, 0.8, 0.2), lr
    for c in constants:
        assert f"t_{comp.value_names[c][1:]}" not in source
    for literal in ("np.float32(0.0)", "np.float32(0.8)", "np.float32(0.2)", "np.float32(0.1)"):
        assert literal in source
    assert "0.800000011920929" not in source and "np.asarray(np.float32" not in source
    # No group takes a constant as a parameter.
    for group in comp.fusion_groups:
        header = group_lines(source, group.name)[0]
        params = re.findall(r"\w+", header.split("(", 1)[1])
        inputs = {f"t_{comp.value_names[i][1:]}" for i in group.inputs
                  if not isinstance(i, Constant)}
        assert set(params) == inputs | {"step"}


def test_a_scalar_constant_result_is_an_array():
    x = ng.placeholder((2,), name="x")
    with ngt.make_transformer("numpy") as t:
        value, total = t.computation([ng.constant(1.5), ng.sum(x * 2.0)], x)(
            np.array([1.0, 2.0], np.float32))
    assert isinstance(value, np.ndarray) and value == 1.5 and total == 6.0


def test_a_user_named_op_keeps_its_name_in_the_ir_source_memory_plan_and_simulator():
    x = ng.placeholder((64, 8), name="x")
    w = ng.variable((8, 8), initial_value=0.5, name="w")
    alpha = Multiply(ng.dot(x, w), ng.dot(x, w) + 1.0, name="alpha")
    with ngt.make_transformer("numpy") as t:
        comp = t.computation(ng.sum(ng.exp(alpha)), x)
        comp(np.ones((64, 8), np.float32))
        assert comp.value_names[alpha] == "%alpha"
        assert "%alpha : Float32[64,8] = multiply(" in comp.ir
        assert re.search(r"out=t_alpha\)  # %alpha = multiply\(%\d+, %\d+\)", comp.source)
        assert "%alpha" in str(comp.memory_plan).split(" <- ", 1)[1]
        topology = simulate.Topology([simulate.Device(
            kind="cpu", flops=1e10, memory_bandwidth=1e10, memory_bytes=2 ** 33,
            call_overhead=1e-6)], [simulate.Link(latency=1e-5, bandwidth=1e9)])
        assert "%alpha" in [step.name for step in simulate.predict(comp, topology).ops]


def attention_step(g, labels=()):
    """(results, placeholder) of an attention-like step over graph `g`: its values, in
    order, carry `labels` as names (the generator's own names, in the tests)."""
    x = ng.placeholder((g.num_nodes, 3), name="x")
    scores = ng.dot(x, ng.constant(np.ones((3, 1), np.float32)))
    edge = ng.gather(scores, g, "src") + ng.gather(scores, g, "dst")
    ops = [scores, edge, ng.exp(edge), ng.aggregate(ng.exp(edge), g, "dst", "sum")]
    ops.append(ng.aggregate(ng.exp(edge) * ng.gather(x, g, "src"), g, "dst", "sum"))
    ops.append(ops[-1] / (ops[-2] + 1.0))
    ops += [ng.sum(ops[-1] * ops[-1])]
    for op, label in zip(ops, labels):
        op.name = label
    return ops[-2:], x


def test_user_names_equal_to_generated_names_do_not_collide():
    """Users may call values what the generator calls its own: numbers, `t_0`, `b_1`,
    `step`, `np`, `K`, `v0`, `seg`, `fusedGraph1`. The step still computes what the
    unnamed one does, and every value keeps a name of its own."""
    rng = np.random.default_rng(1)
    n = 20
    g = ng.Graph.from_edges(rng.integers(0, n, 80), rng.integers(0, n, 80), n)
    labels = ["0", "t_0", "b_1", "1", "step", "np", "K", "v0", "seg", "fusedGraph1", "w_2"]
    xv = rng.normal(size=(n, 3)).astype(np.float32)
    with ngt.make_transformer("numpy") as t:
        plain = t.computation(*attention_step(g))
        named = t.computation(*attention_step(g, labels))
        for a, b in zip(plain(xv), named(xv)):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        names = named.value_names
        values = [op for s in named.steps for op in getattr(s, "ops", [s])]
        assert len({value_identifier(names[op]) for op in values}) == len(values)
        # A user's "0" is %t_0 (t_t_0 in Python) beside the IR's own %0 (t_0); a user's
        # "t_0" then is %t_0_1.
        assert {"%0", "%t_0", "%t_0_1", "%np", "%step"} <= {names[op] for op in values}
        assert "    t_0 = constants[0]" in named.source and "out=t_t_0)" in named.source
