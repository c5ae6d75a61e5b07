"""Element-wise ops of a computation as C functions (make_transformer("numpy", native=True)).

The large element-wise ops of a step (a bias added to every node row, ReLU, its mask, the
mask applied to a gradient) cost NumPy about 10 microseconds each on a batch of a thousand
64-wide rows, three quarters of it the call, not the arithmetic. Native mode renders each
such op as a C loop over its output, its element computed by the op's own `c` template,
the one the GPU transformer renders (transformers/gpu/expressions.py: the same literals,
attribute fields and precision rule), and calls it with every address taken once, when
the generated module binds its buffers.

An op qualifies when its output is a float tensor of at least MIN_ELEMENTS values and of
at most two axes, and each argument is a scalar constant or a C-contiguous tensor of the
output's dtype that broadcasts to it. At bind time an argument overlapping the output
other than exactly (an in-place op reads each element before writing it) falls back to
the NumPy statement, which handles any overlap.
"""
import ctypes

from ngnn.op_graph import ElementWise

from ..gpu.expressions import attribute_literals, ctype, in_precision, literal, unwrapped
from . import native

# Below this many values NumPy's call costs about what a ctypes call does.
MIN_ELEMENTS = 1024
PRELUDE = """#include <math.h>
#include <string.h>
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
static inline float UINT_AS_FLOAT(unsigned int bits) {
    float value; memcpy(&value, &bits, sizeof value); return value;
}
"""


class CFunctions:
    """C functions `<prefix><k>` of one computation, rendered one by one into `functions`
    (with the number of array pointers each takes, `arity`, after `leading` arguments)
    and compiled together into one library by `load()`."""
    prefix, leading = "", ()

    def __init__(self):
        self.functions = []
        self.arity = []
        self.library = None

    def load(self):
        self.library = ctypes.CDLL(native.build(PRELUDE + "\n" + "\n".join(self.functions),
                                                self.prefix + "s"))
        for k, arity in enumerate(self.arity):
            function = getattr(self.library, f"{self.prefix}{k}")
            function.argtypes = list(self.leading) + [ctypes.c_void_p] * arity
            function.restype = None


class NativeElementwise:
    """The element-wise ops of one computation that run in C: `accepts(op)`, then
    `add(op, args)` for each (its C function's name), `source()` the C text of all."""

    def __init__(self):
        self.functions = []         # C source of each op's function
        self.arity = []             # how many arrays each reads
        self.library = None         # the ctypes.CDLL, once load() built it

    def load(self):
        """Compiles (or finds in the cache) and loads the functions."""
        self.library = ctypes.CDLL(native.build(self.source(), "elementwise"))
        for k, arity in enumerate(self.arity):
            function = getattr(self.library, f"elementwise{k}")
            function.argtypes, function.restype = [ctypes.c_void_p] * (arity + 1), None

    @staticmethod
    def accepts(op, args_bound):
        """Whether `op` runs in C; `args_bound`: each argument's array is made at bind."""
        if not isinstance(op, ElementWise) or op.c is None or op.is_view or \
                op.dtype not in native.SUFFIX or not 1 <= op.ndim <= 2 or \
                op.size < MIN_ELEMENTS:
            return False
        for a, bound in zip(op.args, args_bound):
            scalar = a.is_constant and a.value.ndim == 0
            if not scalar and not (bound and a.dtype == op.dtype and a.ndim <= op.ndim and
                                   all(d in (1, o) for d, o in
                                       zip(a.shape[::-1], op.shape[::-1]))):
                return False
        return True

    def add(self, op, comment):
        """Renders `op` as the C function `elementwise<k>`; returns that name."""
        name = f"elementwise{len(self.functions)}"
        t = ctype(op.dtype)
        rows, cols = (1,) + op.shape if op.ndim == 1 else op.shape
        fields, params = attribute_literals(op), []
        for field, a in zip(("x", "y"), op.args):
            if a.is_constant and a.value.ndim == 0:
                fields[field] = literal(a.value, op.dtype)
                continue
            shape = (1,) * (2 - a.ndim) + a.shape
            index = {(rows, cols): "i * %d + j" % cols, (1, cols): "j", (rows, 1): "i",
                     (1, 1): "0"}[(shape[0] if shape[0] == rows else 1,
                                   shape[1] if shape[1] == cols else 1)]
            params.append(f"const {t} *{field}")
            fields[field] = f"{field}[{index}]"
        expr = unwrapped(in_precision(op.c.format(out_ctype=t, **fields), op.dtype))
        self.arity.append(len(params))
        # No `restrict`: an in-place op's output is its argument, element for element.
        self.functions.append(
            f"/* {comment} */\n"
            f"void {name}({', '.join(params + [f'{t} *out'])}) {{\n"
            f"    for (long i = 0; i < {rows}; i++)\n"
            f"        for (long j = 0; j < {cols}; j++)\n"
            f"            out[i * {cols} + j] = {expr};\n"
            "}\n")
        return name

    def source(self):
        return PRELUDE + "\n" + "\n".join(self.functions)
