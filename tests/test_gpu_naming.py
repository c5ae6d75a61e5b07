"""One name per value on the GPU: the IR's `%8` is the kernel parameter `t_8` (the NumPy
module's spelling), the kernel writing it is `<group or template>_t_8`, kernel_report lists
`%8` among its values; every statement computing an op ends with the IR's statement of it
(`// %8 = divide(%6, %7)`), recomputed ones say so; scalar constants are literals in
their dtype's shortest digits (`0.2f`) and an operand is cast only where its type differs
from the op's. Run on OpenCL (PoCL here); the CUDA renderings compile with nvcc."""
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.naming import value_identifier
from ngnn.op_graph import Constant, Multiply
from ngnn.passes import KernelGroup
from ngnn.transformers.gpu.expressions import literal
from ngnn.transformers.gpu.kernels import PREFIXES
from ngnn.transformers.gpu.runtime import compile_ptx, nvcc_available

from test_naming import attention_step, gat_training_step, recipe_gat_training_step

# A statement that ends with the IR's statement of the op it computes.
COMMENTED = re.compile(r"(?P<code>.*;)  // (?P<value>%\w+) = (?P<call>\w+\(.*\))"
                       r"(?P<again>  // recomputed)?")
# The statements declaring a value without computing an op: loads of stored values (their
# names say which) and of a sparse matrix's values.
LOADS = re.compile(r"(float|double|int|long|uchar) v\d+ = (t_\w+|sparse_\w+)\[.*\];")


@pytest.fixture(scope="module")
def gpu():
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        yield t


@pytest.fixture(scope="module", params=[gat_training_step, recipe_gat_training_step])
def training_step(gpu, request):
    return request.param(gpu)


def kernel_texts(comp):
    """{kernel name: its text in comp.source}."""
    source = comp.source
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"KERNEL void (\w+)\(", source)]
    ends = [s for s, _ in starts[1:]] + [len(source)]
    return {name: source[start:end] for (start, name), end in zip(starts, ends)}


def ir_statements(comp):
    """{IR name: the op's call as the IR writes it, without types and scopes}."""
    return {m.group(1): m.group(2) for m in
            re.finditer(r"^\s+(%\w+) : [^=]+ = (?:\w+::)?(\w+\(.*?\))(?:  # .*)?$", comp.ir,
                        flags=re.M)}


def test_kernel_names_parameters_and_report_use_the_irs_names(training_step):
    comp = training_step
    names, kernels = comp.value_names, comp.executor.kernels
    groups = {s.name for s in comp.kernel_plan.steps if isinstance(s, KernelGroup)}
    texts = kernel_texts(comp)
    for kernel in kernels:
        own = value_identifier(names[kernel.op])
        prefix = kernel.name[:-len(own) - 1]
        assert kernel.name.endswith("_" + own), kernel.name
        assert prefix in set(PREFIXES.values()) | {"edge"} or \
            prefix.split("_")[0] in groups, kernel.name
        for op, c_name in kernel.input_names.items():
            assert c_name == value_identifier(names[op])
        header = texts[kernel.name].split("{", 1)[0]
        params = re.findall(r"(\w+)(?:,|\))", header)
        values = [p for p in params if p.startswith("t_")]
        assert values == [value_identifier(names[o]) for o in kernel.outputs] + \
            [value_identifier(names[t]) for t in kernel.inputs]
        assert len(set(params)) == len(params)
        assert kernel.values == ([names[kernel.op]] if kernel.partials else
                                 [names[o] for o in kernel.outputs])
    rows = comp.kernel_report()
    assert [(r["name"], r["values"]) for r in rows] == [(k.name, k.values) for k in kernels]
    # Every value the source names is one the IR defines, and the memory plan says the same.
    defined = set(re.findall(r"(%\w+) :", comp.ir))
    assert {"%" + n[2:] for n in re.findall(r"\bt_\w+", comp.source)} <= defined
    plan = str(comp.memory_plan)
    assert all(names[o] in plan for k in kernels for o in k.outputs
               if comp.memory_plan.slots.get(o) is not None)


def test_every_statement_computing_a_value_names_its_op(training_step):
    statements = ir_statements(training_step)
    commented = 0
    for name, text in kernel_texts(training_step).items():
        for line in text.splitlines():
            line = line.strip()
            match = COMMENTED.fullmatch(line)
            if match:
                commented += 1
                assert match.group("call") == statements[match.group("value")], line
            elif re.match(r"(float|double|int|long|uchar) (v|keep|acc)\d+ = |acc\d+ \+?= ",
                          line):
                assert LOADS.fullmatch(line), f"{name}: {line}"
    assert commented > 100


def test_recomputed_statements_say_so(gpu):
    """An op the IR marks recomputed in a group is marked on every statement computing it
    in the group's kernels; any other op's first statement in a kernel is not, and a
    kernel computing a value again (in a later loop) marks it there."""
    comp = gat_training_step(gpu)
    names, texts = comp.value_names, kernel_texts(comp)
    marked, again_in_kernel = 0, 0
    for step in comp.kernel_plan.steps:
        if not isinstance(step, KernelGroup) or step.name is None:
            continue
        for kernel in (k for k in comp.executor.kernels if k.name.startswith(step.name + "_")):
            seen = set()
            for line in texts[kernel.name].splitlines():
                match = COMMENTED.fullmatch(line.strip())
                if not match:
                    continue
                op = next(o for o in step.ops if names[o] == match.group("value"))
                again = bool(match.group("again"))
                if op in step.recomputed:
                    marked += 1
                    assert again, line
                elif op not in seen:
                    assert not again, line
                else:
                    again_in_kernel += again
                seen.add(op)
    assert marked >= 20 and again_in_kernel >= 5


def test_operands_are_cast_only_where_types_differ(gpu):
    comp = gat_training_step(gpu)
    body = "".join(kernel_texts(comp).values())
    # All float32: the only casts left turn a dropout's keep bit into a float.
    casts = re.findall(r"\((float|double|int)\)\s*(\w+)", body)
    assert casts and all(t == "float" and v.startswith("keep") for t, v in casts), casts
    assert "(float)((" not in body
    # Mixed types: the int operand is converted, the float one is not.
    x = ng.placeholder((6,), name="x")
    k = ng.placeholder((6,), dtype=np.int32, name="k")
    comp = gpu.computation(x * ng.cast(k, np.float32) + x, x, k)
    xv, kv = np.linspace(-1, 1, 6).astype(np.float32), np.arange(6, dtype=np.int32)
    np.testing.assert_allclose(comp(xv, kv), xv * kv + xv, rtol=1e-6)
    (text,) = kernel_texts(comp).values()
    assert len(re.findall(r"\(float\)", text)) == 1 and re.search(r"\(\(float\)v\d+\)", text)


def test_floats_print_shortest_and_scalar_constants_are_literals(gpu):
    comp = gat_training_step(gpu)
    source = comp.source
    for text in ("0.2f", "0.8f", "0.0f"):        # leaky_relu's slope and its gradient
        assert text in source
    assert not re.search(r"\d\.\d{9,}f", source)
    for kernel in comp.executor.kernels:
        assert not any(isinstance(t, Constant) and t.is_scalar for t in kernel.inputs)
    # Shortest digits still read back as the same value, in either precision.
    values = np.array([0.1, 0.2, 1 / 3, 1e-5, 3.4e38, 1.4e-45, -2.5, 1e20, 123456789.0])
    for dtype in (np.float32, np.float64):
        for v in values.astype(dtype):
            text = literal(v, dtype)
            assert dtype(text.rstrip("f")) == v and text.endswith("f") == (dtype == np.float32)
    x = ng.placeholder((3,), dtype=np.float64, name="x")
    comp = gpu.computation(x * 0.1, x)
    assert "* 0.1;" in comp.source
    np.testing.assert_array_equal(comp(np.arange(3.0)), np.arange(3.0) * 0.1)


def test_a_user_named_op_keeps_its_name_in_kernels_report_and_memory_plan(gpu):
    x = ng.placeholder((64, 8), name="x")
    w = ng.variable((8, 8), initial_value=0.5, name="w")
    alpha = Multiply(ng.dot(x, w), ng.dot(x, w) + 1.0, name="alpha")
    comp = gpu.computation([alpha, ng.sum(ng.exp(alpha))], x)
    comp(np.ones((64, 8), np.float32))
    assert comp.value_names[alpha] == "%alpha"
    assert re.search(r"= v\d+ \* v\d+;  // %alpha = multiply\(%\d+, %\d+\)", comp.source)
    assert "ew_t_alpha" in [row["name"] for row in comp.kernel_report()]
    assert ["%alpha"] in [row["values"] for row in comp.kernel_report()]
    assert "GLOBAL const float* RESTRICT t_alpha" in comp.source      # read by the sum
    assert "%alpha" in str(comp.memory_plan).split(" <- ", 1)[1]


# The C names of the generator's own, and a name made like a value's (`t_0`), as user names.
LABELS = ["0", "t_0", "gid", "step", "out", "acc1", "v1"]


def test_user_names_equal_to_generated_names_do_not_collide(gpu):
    """Values named like the kernels' own identifiers (`gid`, `v1`, `acc1`, `out`, `step`)
    or like a value's (`0`, `t_0`) compute what unnamed ones do, and each kernel's
    parameters and the program's kernels keep names of their own."""
    rng = np.random.default_rng(1)
    n = 20
    g = ng.Graph.from_edges(rng.integers(0, n, 80), rng.integers(0, n, 80), n)
    xv = rng.normal(size=(n, 3)).astype(np.float32)
    plain = gpu.computation(*attention_step(g))
    named = gpu.computation(*attention_step(g, LABELS))
    with ngt.make_transformer("numpy") as t:
        expected = t.computation(*attention_step(g, LABELS))(xv)
    for a, b, c in zip(plain(xv), named(xv), expected):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(b, c, rtol=1e-5)
    defined = set(re.findall(r"(%\w+) :", named.ir))
    assert {"%0", "%t_0", "%t_0_1", "%step", "%out", "%acc1", "%v1"} <= defined
    # The user's "0" (%t_0) is t_t_0 beside the IR's own constant %0, t_0, in one kernel.
    assert re.search(r"RESTRICT t_t_0, .*RESTRICT t_0\)", named.source)
    kernel_names = [k.name for k in named.executor.kernels]
    assert len(set(kernel_names)) == len(kernel_names)
    for text in kernel_texts(named).values():
        params = re.findall(r"(\w+)(?:,|\))", text.split("{", 1)[0])
        assert len(set(params)) == len(params)
        assert not {"gid", "v1", "acc1", "out", "step"} & set(params)


@pytest.mark.skipif(not nvcc_available(), reason="nvcc is not on PATH")
def test_cuda_renderings_compile_with_nvcc(gpu):
    rng = np.random.default_rng(1)
    g = ng.Graph.from_edges(rng.integers(0, 20, 80), rng.integers(0, 20, 80), 20)
    comps = [gat_training_step(gpu), gpu.computation(*attention_step(g, LABELS))]
    sources = {f"program{i}": comp.source_for("cuda") for i, comp in enumerate(comps)}
    ptx = compile_ptx(sources)
    for i, comp in enumerate(comps):
        for kernel in comp.executor.kernels:
            assert f".entry {kernel.name}(" in ptx[f"program{i}"]
