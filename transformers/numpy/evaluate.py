"""Evaluate one op on NumPy values with the NumPy transformer's own statements (used by
constant folding, so folded values are exactly what the generated code would compute)."""
import numpy as np
import scipy.special

from . import kernels
from .codegen import NumPyCodeGenerator


def evaluate(op, values):
    out = np.empty(op.shape, dtype=op.dtype)
    names = [f"a{i}" for i in range(len(values))]
    namespace = {"np": np, "scipy": scipy, "K": kernels, "out": out, "step": 0}
    namespace.update(zip(names, values))
    graphs = []

    def refs(kind, obj):
        graphs.append(obj)
        namespace[f"g{len(graphs) - 1}"] = obj
        return f"g{len(graphs) - 1}"

    code = "\n".join(NumPyCodeGenerator(refs).generate_op(op, "out", names))
    exec(code, namespace)
    return np.asarray(namespace["out"], dtype=op.dtype)
