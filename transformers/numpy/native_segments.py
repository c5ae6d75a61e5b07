"""Segments: runs of a step's C calls and matrix products as one C function each
(make_transformer("numpy", native=True)).

With its sweep groups, fused groups and element-wise ops in C, a native step's Python body
is still one statement per C call and per matrix product, and the interpreter's cost of a
statement (a ctypes call's argument conversion, np.matmul's dispatch: 1 to 3 us) is
about what the C of a small batch costs. A run of consecutive such statements is a
segment: one C function that makes the calls in the body's order, so the body makes one
call for the run. Nothing is reordered and every value still lands where the memory plan
puts it, so a segment computes what its statements one by one compute:

  - a sweep group, fused group or element-wise op is called through the address of its
    function (in the computation's other libraries), cast to the function's own type,
    whose declaration is read from the rendered source (no call through a mismatched
    type); its arguments are the ones its prepared Python call passes, a parameter named
    `step` the call number; a function returning int that returns nonzero did not run,
    and the segment stops there (below);
  - a matrix product (`np.matmul`, `K.zero_row_matmul`) calls NumPy's own bundled cblas
    gemm or gemv (native_blas.py) with the arguments np.matmul would pass it for the same
    arrays: the same kernel, the same bits. A zero-row product reads its live row count in the C:
    where that count is below 2 np.matmul takes another path (gemv, its own loop), so the
    segment stops there, returning how many statements it ran, and Python runs the rest
    one by one; so it does for a live count that is not finite (K.live_rows raises).

Everything is bound once, when the generated module binds its buffers: one table of
64-bit slots per segment (functions' addresses, arrays' addresses, shapes, the BLAS
calls' arguments), read by the C. Only a fused group's CSR changes between calls (a GraphSlot's
load replaces it): its two addresses sit in the table's first slots, written before a
call when the graph's arrays are new (native.csr_addresses).
"""
import ctypes
import re

import numpy as np

from ..gpu.expressions import ctype
from . import native
from .native_elementwise import PRELUDE as SHARED_PRELUDE, CFunctions

PRELUDE = r"""
#include <stdint.h>

/* NumPy's bundled cblas gemm and gemv (scipy-openblas64: 64-bit integers), called as
   np.matmul calls them (numpy/_core/src/umath/matmul.c.src): alpha 1, beta 0. */
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
#define BLAS(T, S)                                                                     \
typedef void gemm_##S##_t(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, \
                          int64_t, int64_t, int64_t, T, const T *, int64_t, const T *,  \
                          int64_t, T, T *, int64_t);                                    \
typedef void gemv_##S##_t(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, int64_t, int64_t, T,  \
                          const T *, int64_t, const T *, int64_t, T, T *, int64_t);     \
/* A product's slots (native_blas.matmul_call): routine, GEMM or GEMV, its flags, m, n,  \
   k, a, lda, b, ldb, out, ldc; m or k the live rows' count in a zero-row product. */   \
static void product_##S(const int64_t *p, int64_t m, int64_t k) {                     \
    const T *a = (const T *)(intptr_t)p[7], *b = (const T *)(intptr_t)p[9];           \
    T *out = (T *)(intptr_t)p[11];                                                    \
    if (p[1] == GEMV)       /* a row times b: gemv of b transposed */                 \
        ((gemv_##S##_t *)(intptr_t)p[0])((enum CBLAS_ORDER)p[2],                       \
            (enum CBLAS_TRANSPOSE)p[3], k, p[5], (T)1, b, p[10], a, p[8], (T)0, out,     \
            p[12]);                                                                    \
    else                                                                               \
        ((gemm_##S##_t *)(intptr_t)p[0])(CblasRowMajor, (enum CBLAS_TRANSPOSE)p[2],    \
            (enum CBLAS_TRANSPOSE)p[3], m, p[5], k, (T)1, a, p[8], b, p[10], (T)0, out,  \
            p[12]);                                                                    \
}                                                                                      \
/* K.zero_row_matmul(contract=False): out[:n] = a[:n] @ b, out[n:] = 0; 0 where n < 2   \
   (np.matmul's gemv or own loop) and the statement is left to Python. */               \
static int zero_row_product_##S(const int64_t *p, double live) {                      \
    int64_t n;                                                                         \
    if (!live_count(live, p[4], &n) || n < 2) return 0;                                \
    product_##S(p, n, p[6]);                                                           \
    for (int64_t i = n; i < p[4]; i++)                                                 \
        memset((T *)(intptr_t)p[11] + i * p[12], 0, (size_t)p[5] * sizeof(T));         \
    return 1;                                                                          \
}                                                                                      \
/* K.zero_row_matmul(contract=True): out = a[:, :n] @ b[:n]; 0 where n < 2. */          \
static int zero_row_contraction_##S(const int64_t *p, double live) {                  \
    int64_t n;                                                                         \
    if (!live_count(live, p[6], &n) || n < 2) return 0;                                \
    product_##S(p, p[4], n);                                                           \
    return 1;                                                                          \
}

/* K.live_rows: ceil(live) clamped to [0, rows]; 0 where live is not finite (Python's
   math.ceil raises there, so the statement is left to it). */
static int live_count(double live, int64_t rows, int64_t *n) {
    if (!isfinite(live)) return 0;
    double bound = ceil(live);
    *n = bound < 0 ? 0 : bound > (double)rows ? rows : (int64_t)bound;
    return 1;
}

enum { GEMM, GEMV };
BLAS(float, f32)
BLAS(double, f64)
"""
PRODUCT_SLOTS = 13      # routine, GEMM or GEMV, flags, m, n, k, a, lda, b, ldb, out, ldc
SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


class Call:
    """A segment's statement that calls a C function of another of the computation's
    libraries (`functions`, a CFunctions or NativeElementwise, its function `name`);
    `csr`: for a fused group, the (graph, csr, other column, rows, index dtype) whose
    indptr and column arrays are its second and third arguments; `fed`: {parameter
    name: (the run's parameter, its shape, its dtype)} for the arrays fed to the step it
    reads, whose addresses are taken at each call."""

    def __init__(self, functions, name, csr=None, fed=None):
        self.functions, self.name, self.csr, self.fed = functions, name, csr, fed or {}


class Product:
    """A segment's matrix product of `dtype`: `live` None (np.matmul), else the dtype of
    the live row count of a K.zero_row_matmul and `contract` its flag; `fed`: {"live":
    (the run's parameter, its shape, its dtype)} where that count is fed to the step."""

    def __init__(self, dtype, live=None, contract=False, fed=None):
        self.dtype, self.live, self.contract = np.dtype(dtype), live, contract
        self.fed = fed or {}


class Statement:
    """A statement of the step's body that may join a segment: `text` its Python call
    (reading `step` and the run's parameters where it needs them), `comment` its trailing
    comment, `before` the body's lines before it (a sweep group's ops), `ir` the IR
    statements it computes, `member` its C (Call or Product), `arguments` the bind-time
    expression of its slots (native.py's *_arguments), `key` the name of the first value
    it makes."""

    def __init__(self, text, comment, ir, member, arguments, key, before=()):
        self.text, self.comment, self.ir, self.member = text, comment, ir, member
        self.arguments, self.key, self.before = arguments, key, list(before)

    def lines(self):
        """The statement as the body writes it outside a segment."""
        return self.before + [self.text + self.comment]


def declaration(functions, name):
    """The return type (void, or int: nonzero where it did not run and its Python
    statements are to) and the parameter list of C function `name` as `functions`
    rendered it (the line `void name(...) {` that each renderer writes)."""
    source = functions.source() if hasattr(functions, "source") else \
        "\n".join(functions.functions)
    found = re.search(rf"^(void|int) {name}\((.*)\) \{{$", source, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no C function {name} was rendered")
    return found.group(1), [p.strip() for p in found.group(2).split(",")]


def parameter_type(parameter):
    """`const float *a0` -> `const float *`; `long n_v` -> `long`."""
    return re.match(r"^(.*?)\s*\w+$", parameter).group(1).rstrip()


def parameter_name(parameter):
    """`const float *a0` -> `a0`."""
    return re.search(r"(\w+)$", parameter).group(1)


class SegmentFunctions(CFunctions):
    """The segments of one computation as C functions `segment<k>(table, step)`, each
    returning how many of its statements it ran: `add(members, comments)` renders one,
    `load()` compiles all. A callee's parameter named `step` (a function that draws
    dropout masks: the call number, the run function's `step`) gets the segment's."""
    prefix = "segment"

    def __init__(self):
        super().__init__()
        self.declared = set()       # the callees whose function types are declared

    def load(self):
        self.library = ctypes.CDLL(native.build(self.source(), "segments"))
        for k in range(len(self.functions)):
            function = getattr(self.library, f"{self.prefix}{k}")
            function.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
            function.restype = ctypes.c_long

    def source(self):
        # The other libraries' prelude first: their declarations may use its types.
        return SHARED_PRELUDE + PRELUDE + "\n" + "\n".join(self.functions)

    def add(self, members, comments):
        """Renders `members` (Call or Product, in body order; `comments[k]` the IR
        statements of the k-th) as `segment<k>`. Returns its name, its CSR entries (the
        table's first slots, two each), the arrays fed to the step it reads ((name,
        shape, dtype), a slot each, after those) and the number of slots of its table."""
        name = f"segment{len(self.functions)}"
        csr, fed = [], []
        for member in members:
            if isinstance(member, Call) and member.csr is not None and \
                    not any(member.csr[0] is c[0] and member.csr[1:] == c[1:] for c in csr):
                csr.append(member.csr)
            for array in getattr(member, "fed", {}).values():
                if array not in fed:
                    fed.append(array)
        slot = 2 * len(csr) + len(fed)
        lines, body = [], []
        for k, (member, ir) in enumerate(zip(members, comments)):
            body += [f"    /* {c} */" for c in ir]
            if isinstance(member, Product):
                s = SUFFIX[member.dtype]
                if member.live is None:
                    body.append(f"    product_{s}(p + {slot}, p[{slot + 4}], p[{slot + 6}]);")
                else:
                    count = 2 * len(csr) + fed.index(member.fed["live"]) if member.fed \
                        else slot + PRODUCT_SLOTS
                    live = f"(double)((const {ctype(member.live)} *)(intptr_t)p[{count}])[0]"
                    kind = "contraction" if member.contract else "product"
                    body.append(f"    if (!zero_row_{kind}_{s}(p + {slot}, {live})) "
                                f"return {k};")
                slot += PRODUCT_SLOTS + (member.live is not None and not member.fed)
                continue
            result, parameters = declaration(member.functions, member.name)
            callee = f"{member.name}_t"
            if callee not in self.declared:
                self.declared.add(callee)
                lines.append(f"typedef {result} {callee}({', '.join(parameters)});")
            function, slot = slot, slot + 1
            arguments = []
            for j, parameter in enumerate(parameters):
                if parameter_name(parameter) == "step":
                    arguments.append("step")        # the call number, the segment's
                    continue
                if parameter_name(parameter) in member.fed:
                    position = 2 * len(csr) + fed.index(member.fed[parameter_name(parameter)])
                elif member.csr is not None and j in (1, 2):     # indptr, columns
                    position = 2 * next(i for i, c in enumerate(csr) if c[0] is member.csr[0]
                                        and c[1:] == member.csr[1:]) + j - 1
                else:
                    position, slot = slot, slot + 1
                arguments.append(f"({parameter_type(parameter)})(intptr_t)p[{position}]")
            call = f"(({callee} *)(intptr_t)p[{function}])(" + ", ".join(arguments) + ")"
            # A function that says it did not run leaves its statement and the rest to Python.
            body.append(f"    if ({call}) return {k};" if result == "int" else f"    {call};")
        lines += [f"long {name}(const int64_t *p, unsigned long long step) {{"] + body + \
            [f"    return {len(members)};", "}"]
        self.functions.append("\n".join(lines) + "\n")
        return name, csr, fed, slot
