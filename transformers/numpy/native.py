"""Native (C) batch-norm kernels for the NumPy transformer: `make_transformer("numpy",
native=True)`.

A graph-classification step over small graphs is short enough that NumPy's per-call cost
dominates its non-product work: each `K.batch_norm_*` kernel is five to seven NumPy
calls over a (rows, F) tensor and its (F,) statistics, 40 such kernels a GIN-0 training
step (docs/native.md has the profile). Here each kernel is one C function of one or two
passes over the live rows, with the same arguments, results and row rules as its NumPy
twin in kernels.py (rows past the live count are 0; `live` None means every row).

The C source below is compiled once per machine with the system C compiler (`cc`, or
the compiler Python was built with), loaded with ctypes (standard library: no new
dependency), and cached under ~/.cache/ngnn/native (NGNN_CACHE_DIR overrides) by the
hash of the source, the compiler and its flags, written to a temporary name first and
renamed so concurrent processes never load a half-written library. Without a compiler
the transformer warns once and runs the NumPy kernels.

Sums run over the rows in order in the tensor's own dtype, one accumulator per column, on
one thread: deterministic, as NumPy's are. They are not NumPy's BLAS order, so float32
results differ from the NumPy kernels' in the last bits (float64: below 1e-12). Where an
argument is not a C-contiguous array of the kernel's dtype the NumPy kernel runs instead.
"""
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
import warnings

import numpy as np

from . import kernels as K
from . import native_blas

SOURCE = r"""
#include <math.h>
#include <string.h>

/* Every kernel: `rows` rows of F columns, C-contiguous; `n` the live rows (rows past them
   are 0 in each (rows, F) result). */
#define KERNELS(T, S)                                                                   \
/* out[0] the mean, out[1] the biased variance of each column over the live rows. */  \
void batch_norm_stats_##S(long rows, long n, long F, const T *restrict x,             \
                          T *restrict out) {                                          \
    T *restrict mean = out, *restrict var = out + F;                                  \
    T count = (T)(n > 1 ? n : 1);                                                     \
    memset(out, 0, 2 * F * sizeof(T));                                                \
    for (long i = 0; i < n; i++)                                                      \
        for (long f = 0; f < F; f++) mean[f] += x[i * F + f];                         \
    for (long f = 0; f < F; f++) mean[f] /= count;                                    \
    for (long i = 0; i < n; i++)                                                      \
        for (long f = 0; f < F; f++) {                                                \
            T c = x[i * F + f] - mean[f];                                             \
            var[f] += c * c;                                                          \
        }                                                                             \
    for (long f = 0; f < F; f++) var[f] /= count;                                     \
}                                                                                     \
/* (x - mean) * (weight / sqrt(var + eps)) + bias; `scale` (F,) scratch. */            \
void batch_norm_apply_##S(long rows, long n, long F, const T *restrict x,             \
                          const T *restrict stats, const T *restrict weight,          \
                          const T *restrict bias, double eps, T *restrict out,        \
                          T *restrict scale) {                                        \
    for (long f = 0; f < F; f++) scale[f] = weight[f] / (T)sqrt(stats[F + f] + (T)eps); \
    for (long i = 0; i < n; i++)                                                      \
        for (long f = 0; f < F; f++)                                                  \
            out[i * F + f] = (x[i * F + f] - stats[f]) * scale[f] + bias[f];          \
    memset(out + n * F, 0, (rows - n) * F * sizeof(T));                               \
}                                                                                     \
/* delta * (weight / sqrt(var + eps)); `scale` (F,) scratch. */                        \
void batch_norm_apply_grad_##S(long rows, long n, long F, const T *restrict delta,    \
                               const T *restrict stats, const T *restrict weight,     \
                               double eps, T *restrict out, T *restrict scale) {      \
    for (long f = 0; f < F; f++) scale[f] = weight[f] / (T)sqrt(stats[F + f] + (T)eps); \
    for (long i = 0; i < n; i++)                                                      \
        for (long f = 0; f < F; f++) out[i * F + f] = delta[i * F + f] * scale[f];    \
    memset(out + n * F, 0, (rows - n) * F * sizeof(T));                               \
}                                                                                     \
/* out[0] = sum of delta * (x - mean), out[1] = sum of delta, over the live rows. */  \
void batch_norm_apply_sums_##S(long rows, long n, long F, const T *restrict delta,    \
                               const T *restrict x, const T *restrict stats,          \
                               T *restrict out) {                                     \
    memset(out, 0, 2 * F * sizeof(T));                                                \
    for (long i = 0; i < n; i++)                                                      \
        for (long f = 0; f < F; f++) {                                                \
            T d = delta[i * F + f];                                                   \
            out[F + f] += d;                                                          \
            out[f] += d * (x[i * F + f] - stats[f]);                                  \
        }                                                                             \
}                                                                                     \
/* (x - mean) * (2 delta[1] / n) + delta[0] / n, the factors rounded as the NumPy     \
   kernel rounds them; `factors` (2, F) scratch. */                                   \
void batch_norm_stats_grad_##S(long rows, long n, long F, const T *restrict delta,    \
                               const T *restrict x, const T *restrict stats,          \
                               T *restrict out, T *restrict factors) {                \
    double inverse = 1.0 / (double)(n > 1 ? n : 1);                                   \
    T *restrict spread = factors, *restrict shift = factors + F;                      \
    for (long f = 0; f < F; f++) {                                                    \
        spread[f] = delta[F + f] * (T)(2.0 * inverse);                                \
        shift[f] = delta[f] * (T)inverse;                                             \
    }                                                                                 \
    for (long i = 0; i < n; i++)                                                      \
        for (long f = 0; f < F; f++)                                                  \
            out[i * F + f] = (x[i * F + f] - stats[f]) * spread[f] + shift[f];        \
    memset(out + n * F, 0, (rows - n) * F * sizeof(T));                               \
}

KERNELS(float, f32)
KERNELS(double, f64)

/* K.gather_sum's sparse product with one head: out[v] = sum over the CSR positions k of
   block vertex v (seg[v] to seg[v + 1]) of weight[k] * x[cols[k]], or of x[cols[k]]
   without weights; rows of F values. Each output element is summed in CSR order, as
   SciPy's csr_matvecs sums it (a weight of 1 multiplies exactly): the same to the bit.
   Sixteen columns at a time are summed in registers, written once. */
#define GATHER_COLUMNS(T, TERM)                                                         \
    for (long v = 0; v < n_v; v++) {                                                  \
        T *restrict o = out + v * F;                                                  \
        long f = 0;                                                                   \
        for (; f + 16 <= F; f += 16) {                                                \
            T acc[16] = {0};                                                          \
            for (long k = seg[v]; k < seg[v + 1]; k++) {                              \
                const T *restrict row = x + (long)cols[k] * F + f;                    \
                for (int j = 0; j < 16; j++) acc[j] += TERM(row[j]);                  \
            }                                                                         \
            for (int j = 0; j < 16; j++) o[f + j] = acc[j];                           \
        }                                                                             \
        for (; f < F; f++) {                                                          \
            T acc = 0;                                                                \
            for (long k = seg[v]; k < seg[v + 1]; k++)                                \
                acc += TERM(x[(long)cols[k] * F + f]);                                \
            o[f] = acc;                                                               \
        }                                                                             \
    }
#define PLAIN(value) (value)
#define WEIGHTED(value) (weight[k] * (value))
#define GATHER(T, S, I, IS)                                                             \
void gather_sum_##S##_##IS(long n_v, long F, const I *restrict seg,                    \
                           const I *restrict cols, const T *restrict weight,           \
                           const T *restrict x, T *restrict out) {                     \
    if (weight) {                                                                     \
        GATHER_COLUMNS(T, WEIGHTED)                                                   \
    } else {                                                                          \
        GATHER_COLUMNS(T, PLAIN)                                                      \
    }                                                                                 \
}

GATHER(float, f32, long, i64)
GATHER(double, f64, long, i64)
GATHER(float, f32, int, i32)
GATHER(double, f64, int, i32)

/* A step's assignments landing last, in order: dst[k] gets nbytes[k] bytes of src[k]. */
void copy_all(long n, void *const *dst, void *const *src, const long *nbytes) {
    for (long k = 0; k < n; k++) memmove(dst[k], src[k], (size_t)nbytes[k]);
}
"""

# -ffp-contract=off: a * b + c rounds twice, as NumPy's separate calls do (no FMA), so
# the element-wise results equal the NumPy kernels'. -march=native: the library is built
# on (and cached for) the machine that runs it.
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared"]
SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
# Each kernel's C parameters: rows, live rows, F, the arrays, eps where it has one, its
# output and any scratch.
_L, _P, _D = ctypes.c_long, ctypes.c_void_p, ctypes.c_double
KERNEL_PARAMS = {
    "batch_norm_stats": [_L, _L, _L, _P, _P],
    "batch_norm_apply": [_L, _L, _L, _P, _P, _P, _P, _D, _P, _P],
    "batch_norm_apply_grad": [_L, _L, _L, _P, _P, _P, _D, _P, _P],
    "batch_norm_apply_sums": [_L, _L, _L, _P, _P, _P, _P],
    "batch_norm_stats_grad": [_L, _L, _L, _P, _P, _P, _P, _P],
}
INDEX_SUFFIX = {np.dtype(np.int64): "i64", np.dtype(np.int32): "i32"}
# gather_sum: vertices, F, seg, cols, weight or NULL, x, out.
GATHER_PARAMS = [_L, _L, _P, _P, _P, _P, _P]
NATIVE_KERNELS = set(KERNEL_PARAMS) | {"gather_sum"}     # what `N.` offers


class NativeUnavailable(RuntimeError):
    """No C compiler, or the kernels did not compile here."""


def compiler():
    """The C compiler: $CC, else `cc`, else the one Python was built with; None if none
    of them is on this machine."""
    for candidate in (os.environ.get("CC"), "cc", sysconfig.get_config_var("CC")):
        if candidate:
            found = shutil.which(candidate.split()[0])
            if found:
                return found
    return None


def cache_dir():
    root = os.environ.get("NGNN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ngnn")
    return os.path.join(root, "native")


def _cpu_identity():
    """What -march=native depends on: the CPU's model and feature flags, where Linux says."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


@functools.lru_cache(maxsize=None)
def _version(cc):
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise NativeUnavailable(f"the C compiler {cc} does not run: {error}") from None


def build(source, stem):
    """The path of the shared library compiled from C `source`, named `stem` and the hash
    of the source, the compiler, its flags and the CPU; built once, then found in the
    cache. Raises NativeUnavailable saying why it cannot be built."""
    cc = compiler()
    if cc is None:
        raise NativeUnavailable("no C compiler found (tried $CC, cc and Python's "
                                f"{sysconfig.get_config_var('CC')!r})")
    key = hashlib.sha256("\0".join([source, cc, _version(cc), " ".join(FLAGS),
                                    platform.machine(), _cpu_identity()]).encode())
    folder = cache_dir()
    path = os.path.join(folder, f"{stem}_{key.hexdigest()[:24]}.so")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as work:
            source_file = os.path.join(work, f"{stem}.c")
            with open(source_file, "w") as f:
                f.write(source)
            built = os.path.join(work, f"{stem}.so")
            result = subprocess.run([cc, *FLAGS, "-o", built, source_file, "-lm"],
                                    capture_output=True, text=True, timeout=300)
            if result.returncode != 0:
                raise NativeUnavailable(f"{cc} failed on {stem}.c:\n{result.stderr.strip()}")
            os.replace(built, path)     # atomic: another process sees all of it or none
    return path


@functools.lru_cache(maxsize=None)
def library():
    """The compiled kernels (a ctypes.CDLL), built or found in the cache; raises
    NativeUnavailable saying why not."""
    path = build(SOURCE, "kernels")
    lib = ctypes.CDLL(path)
    for name, params in KERNEL_PARAMS.items():
        for suffix in SUFFIX.values():
            function = getattr(lib, f"{name}_{suffix}")
            function.argtypes, function.restype = params, None
    lib.copy_all.argtypes, lib.copy_all.restype = [_L, _P, _P, _P], None
    for suffix in SUFFIX.values():
        for index in INDEX_SUFFIX.values():
            function = getattr(lib, f"gather_sum_{suffix}_{index}")
            function.argtypes, function.restype = GATHER_PARAMS, None
    return lib


@functools.lru_cache(maxsize=None)
def usable():
    """Whether the kernels compile and load here; where not, warns (once a process) why,
    and the NumPy transformer runs its NumPy kernels."""
    try:
        library()
    except NativeUnavailable as error:
        warnings.warn(f"make_transformer('numpy', native=True): {error}; running the NumPy "
                      "kernels instead", RuntimeWarning, stacklevel=2)
        return False
    return True


# Where each kernel finds its (rows, F) tensor among its arguments, and how many (F,) rows
# of scratch it needs. Every C kernel takes (rows, live rows, F, the tensors' addresses,
# eps where it has one, the output's address, the scratch's address).
ROWS_ARGUMENT = {"batch_norm_stats": 0, "batch_norm_apply": 0, "batch_norm_apply_grad": 0,
                 "batch_norm_apply_sums": 1, "batch_norm_stats_grad": 1}
SCRATCH_ROWS = {"batch_norm_apply": 1, "batch_norm_apply_grad": 1, "batch_norm_stats_grad": 2}


def _fits(x, *arrays):
    """x a (rows, F) tensor of a dtype the C kernels have, and every array C-contiguous and
    of x's dtype, as they assume; else the NumPy kernel runs."""
    return x.ndim == 2 and x.dtype in SUFFIX and \
        all(a.dtype == x.dtype and a.flags.c_contiguous for a in arrays)


def prepare(kernel, *args, eps=None, out):
    """`K.<kernel>(*args, eps=eps, out=out)` as a function of no arguments, the C kernel
    with its arrays' addresses taken now: the generated module prepares each call once,
    when it binds its buffers, as taking an array's address costs about a microsecond,
    a tenth of the kernel. Only the live row count (the last of `args`) is read at each
    call. Arrays that do not fit the C kernels get the NumPy kernel."""
    *tensors, live = args
    x = tensors[ROWS_ARGUMENT[kernel]]
    if not _fits(x, *tensors, out):
        return functools.partial(getattr(K, kernel), *args, out=out,
                                 **({} if eps is None else {"eps": eps}))
    rows, features = x.shape
    scratch = [np.empty((SCRATCH_ROWS[kernel], features), x.dtype)] \
        if kernel in SCRATCH_ROWS else []
    function = getattr(library(), f"{kernel}_{SUFFIX[x.dtype]}")
    addresses = [a.ctypes.data for a in tensors] + ([] if eps is None else [eps]) + \
        [out.ctypes.data] + [a.ctypes.data for a in scratch]

    def call():
        function(rows, K.live_rows(live, rows), features, *addresses)
        return out
    call.arrays = (tensors, out, scratch)      # alive as long as their addresses are used
    return call


# The kernels with K.batch_norm_*'s signatures, for arrays made as the step runs.

def batch_norm_stats(x, live, out):
    return prepare("batch_norm_stats", x, live, out=out)()


def batch_norm_apply(x, stats, weight, bias, live, eps, out):
    return prepare("batch_norm_apply", x, stats, weight, bias, live, eps=eps, out=out)()


def batch_norm_apply_grad(delta, stats, weight, live, eps, out):
    return prepare("batch_norm_apply_grad", delta, stats, weight, live, eps=eps, out=out)()


def batch_norm_apply_sums(delta, x, stats, live, out):
    return prepare("batch_norm_apply_sums", delta, x, stats, live, out=out)()


def batch_norm_stats_grad(delta, x, stats, live, out):
    return prepare("batch_norm_stats_grad", delta, x, stats, live, out=out)()


def gather_sum(x, weight, cols, seg, reduce, out):
    """K.gather_sum in C where one head's product over contiguous arrays is asked for; its
    other cases (several heads, other layouts) run K.gather_sum."""
    n_v, n_e = len(seg) - 1, len(cols)
    width = x.size // x.shape[0] if x.shape[0] else 0
    weights = None if weight is None else weight.reshape(-1)
    if x.dtype not in SUFFIX or seg.dtype not in INDEX_SUFFIX or cols.dtype != seg.dtype or \
            out.dtype != x.dtype or out.size != n_v * width or \
            (weights is not None and (weights.size != n_e or weights.dtype != x.dtype)) or \
            not all(a.flags.c_contiguous for a in (x, cols, seg, out) +
                    (() if weights is None else (weights,))):
        return K.gather_sum(x, weight, cols, seg, reduce, out)
    function = getattr(library(), f"gather_sum_{SUFFIX[x.dtype]}_{INDEX_SUFFIX[seg.dtype]}")
    function(n_v, width, seg.ctypes.data, cols.ctypes.data,
             None if weights is None else weights.ctypes.data, x.ctypes.data, out.ctypes.data)
    if reduce == "mean":
        K.divide_by_degrees(out, seg)
    return out


def prepare_elementwise(function, args, out, statement):
    """A C function of native_elementwise over the arrays `args` into `out`, as a function of
    no arguments with their addresses taken now; `statement` (the op's NumPy call) where
    an argument overlaps `out` other than element for element, or is not C-contiguous."""
    for a in args:
        exact = a.ctypes.data == out.ctypes.data and a.shape == out.shape and \
            a.strides == out.strides
        if not a.flags.c_contiguous or (np.may_share_memory(a, out) and not exact):
            return statement
    addresses = [a.ctypes.data for a in args] + [out.ctypes.data]

    def call():
        function(*addresses)
        return out
    call.arrays = (args, out)       # alive as long as their addresses are used
    call.c_call = (function, addresses)         # for a segment (call_arguments)
    return call


def rendered_for(array, shape, dtype):
    """Whether `array`, fed at a call, is what the C was rendered to read: an ndarray of
    `shape` and `dtype`, C-contiguous (else the call runs its NumPy statements)."""
    return isinstance(array, np.ndarray) and array.shape == shape and \
        array.dtype == dtype and array.flags.c_contiguous


def prepare_sweep(function, inputs, outputs, live, segments, statements, fed=()):
    """The C function of a sweep group (native_sweeps.py) over `inputs` (read), `outputs`
    (written) and the live-row count `live` (or None), as a function with their
    addresses taken now, of the arrays fed to the call (`fed`: their positions in
    `inputs`, None there, and the shape and dtype each was rendered for), then the call
    number where the group has a dropout. `segments`: each segment's (rows, F), the
    positions, in inputs + outputs + [live], of the arrays it reads or writes, and
    optionally of those it writes (else every output among them). Segments run one
    after another, as the ops one by one would; within one, an output may share memory
    with another of its arrays only element for element, a whole (rows, F) array from
    the same address, its elements no wider than the other's (float32 values over the
    float64 a cast read: element i's write reaches no byte of a later element): the
    memory plan makes such sharing only where a value dies as the next is made, which
    passes in step order keep right; any other overlap could be read after the group
    wrote it. There, or where an array is not C-contiguous, `statements` (the group's
    ops one by one, a function of the same arguments) is returned instead; they also
    run where a fed array is not of the shape and dtype rendered or not C-contiguous,
    and where the C returns non-zero (a one-hot's class id out of range: the statements
    raise the error naming it). A fed array's address is taken again only when it is
    another array than at the last call."""
    arrays = list(inputs) + list(outputs) + ([] if live is None else [live])
    written = set(range(len(inputs), len(inputs) + len(outputs)))
    if not all(a is None or a.flags.c_contiguous for a in arrays):
        return statements
    for (rows, width), positions, *writes in segments:
        for k in positions:
            if k not in (set(writes[0]) if writes else written):
                continue
            o = arrays[k]
            for m in positions:
                a = arrays[m]
                if m == k or a is None or not np.may_share_memory(a, o):
                    continue
                exact = a.ctypes.data == o.ctypes.data and a.shape == o.shape and \
                    o.itemsize <= a.itemsize and o.size == rows * width
                if not exact:
                    return statements
    addresses = [None if a is None else a.ctypes.data for a in arrays]

    if not fed:
        def call(*step):        # a group with a dropout is called with the call number
            if function(*step, *addresses):
                statements(*step)
        call.arrays = arrays    # alive as long as their addresses are used
        call.c_call = (function, addresses)     # for a segment (call_arguments)
        return call
    last = {"fed": None, "fits": False}

    def call_fed(*args):
        given, step = args[:len(fed)], args[len(fed):]
        known = last["fed"]
        if known is None or any(a is not b for a, b in zip(given, known)):
            last["fed"] = given     # kept alive while their addresses are used
            last["fits"] = all(rendered_for(a, shape, dtype)
                               for a, (_, shape, dtype) in zip(given, fed))
            if last["fits"]:
                for a, (k, _, _) in zip(given, fed):
                    addresses[k] = a.ctypes.data
        if not last["fits"] or function(*step, *addresses):
            statements(*args)
    call_fed.arrays = arrays
    # For a segment (call_arguments): the addresses but the fed arrays', which it takes.
    call_fed.c_call = (function, [a for k, a in enumerate(addresses)
                                  if k not in {f[0] for f in fed}])
    return call_fed


def prepare_group(function, graph, csr, other, order, shapes, dtype, outputs, python,
                  live=False):
    """A fused group's C function (native_groups.py) as a function of the group's Python
    parameters (its inputs, then `step`): the C reads the inputs at positions `order`
    (each of shape `shapes[k]` and `dtype`), the graph's `csr` CSR as it is at the call,
    and writes `outputs` (bound once). Where an array is not C-contiguous or not of the
    shape or dtype rendered, or the CSR is not of the vertices rendered, the group's
    Python function `python` runs instead. Addresses are taken again only for an array
    that is another than at the last call (a fed array; a new batch's CSR, whose
    addresses every group over that graph then shares: `csr_addresses`): taking one
    costs about a microsecond, and a step runs a dozen groups over each batch. With
    `live`, the call takes one more argument, a fed (1,) int64 count that the C reads
    after the CSR (it computes the rows below it: native_groups.py) and the Python
    function does not take."""
    rows = outputs[0].shape[0]
    if not all(o.flags.c_contiguous and o.dtype == dtype for o in outputs):
        return python
    index_dtype = getattr(graph, f"{csr}_indptr").dtype
    output_addresses = tuple(o.ctypes.data for o in outputs)
    last = {"inputs": None, "addresses": None}

    def addresses(args):
        """The addresses of the inputs among `args` and of the outputs, or None where an
        input is not what the C was rendered for; an input given as None (fed to a
        segment at each call) has none."""
        inputs = tuple(args[k] for k in order)
        if all(a is None or rendered_for(a, shape, dtype) for a, shape in zip(inputs, shapes)):
            return tuple(a.ctypes.data for a in inputs if a is not None) + output_addresses
        return None

    def call(*args):
        count = ()
        if live:
            args, fed = args[:-1], args[-1]
            if not rendered_for(fed, (1,), np.int64):
                return python(*args)
            count = (fed.ctypes.data,)
        graph_addresses = csr_addresses(graph, csr, other, rows, index_dtype)
        inputs = tuple(args[k] for k in order)
        known = last["inputs"]
        if known is None or any(a is not b for a, b in zip(inputs, known)):
            last["inputs"] = inputs     # kept alive while their addresses are used
            last["addresses"] = addresses(args)
        if graph_addresses is None or last["addresses"] is None:
            return python(*args)
        function(rows, *graph_addresses, *count, *last["addresses"])
    call.arrays = outputs       # alive as long as their addresses are used
    call.c_group = (function, rows, addresses)      # for a segment (group_arguments)
    return call


def csr_addresses(graph, csr, other, rows, index_dtype):
    """The addresses of `graph`'s `csr` CSR arrays (indptr and `other`'s column), or None
    where they are not C-contiguous arrays of `index_dtype` over `rows` vertices: kept
    on the graph with the arrays they were taken of, so the groups of a step over one
    batch take them once (a slot's load replaces the arrays)."""
    indptr, cols = getattr(graph, f"{csr}_indptr"), getattr(graph, f"{csr}_{other}")
    kept = graph.__dict__.setdefault("_native_csr_addresses", {})
    entry = kept.get((csr, other))
    if entry is None or entry[0] is not indptr or entry[1] is not cols:
        fits = len(indptr) == rows + 1 and indptr.dtype == index_dtype and \
            cols.dtype == index_dtype and cols.flags.c_contiguous and \
            indptr.flags.c_contiguous
        entry = kept[csr, other] = (indptr, cols, (indptr.ctypes.data, cols.ctypes.data)
                             if fits else None)
    return entry[2]


def prepare_copies(pairs):
    """The assignments (variable, value) that land last in a step, as one function of no
    arguments: one C call copying the pairs of one dtype and shape, both C-contiguous, and
    np.copyto for the others (a copy of the same bytes: the values are NumPy's). The
    variables are distinct, so the order of the copies does not matter."""
    fits = [v.dtype == x.dtype and v.shape == x.shape and v.flags.c_contiguous and
            x.flags.c_contiguous for v, x in pairs]
    others = [pair for pair, fit in zip(pairs, fits) if not fit]
    pairs = [pair for pair, fit in zip(pairs, fits) if fit]
    table = np.array([[v.ctypes.data for v, _ in pairs], [x.ctypes.data for _, x in pairs],
                      [v.nbytes for v, _ in pairs]], dtype=np.int64).reshape(3, len(pairs))
    arguments = (len(pairs), table[0].ctypes.data, table[1].ctypes.data,
                 table[2].ctypes.data)
    function = library().copy_all

    def copies():
        function(*arguments)
        for variable, value in others:
            np.copyto(variable, value)
    copies.arrays = (pairs, table)     # alive as long as their addresses are used
    return copies


# Segments (native_segments.py): each statement's slots in the segment's table, or None
# where the statement does not run as C (the segment then runs its statements one by one).

def call_arguments(call):
    """A prepared sweep group's or element-wise op's slots: its function's address and
    its arguments; None where the NumPy statements were prepared instead."""
    if not hasattr(call, "c_call"):
        return None
    function, arguments = call.c_call
    return [ctypes.cast(function, ctypes.c_void_p).value, *arguments]


def group_arguments(call, inputs):
    """A fused group's slots over `inputs` (its call's arguments but `step`, None for an
    array fed to the step): its function's address, its vertices, its inputs' and
    outputs' addresses (the CSR's and the fed arrays' are the segment's first slots);
    None where its Python function runs."""
    if not hasattr(call, "c_group"):
        return None
    function, rows, addresses = call.c_group
    found = addresses(inputs)
    return None if found is None else \
        [ctypes.cast(function, ctypes.c_void_p).value, rows, *found]


def product_arguments(a, b, out, contract=None, live=None):
    """The slots of `np.matmul(a, b, out=out)` (`contract` None), or of
    `K.zero_row_matmul(a, b, live, contract, out)`: the BLAS routine's address and the
    call np.matmul makes with it (native_blas.matmul_call), and the live count's address
    (no slot where `live` is None: the count is fed to the segment); None where np.matmul
    makes no such call. A zero-row product reads its live count in the C, and its call
    must be the same but for that count from 2 to all rows (else None), as np.matmul
    would make it over the live rows."""
    if contract is None:
        call = native_blas.matmul_call(a, b, out)
        extra = []
    else:
        rows = b.shape[0] if contract else a.shape[0]

        def at(n):
            return native_blas.matmul_call(a[:, :n], b[:n], out) if contract else \
                native_blas.matmul_call(a[:n], b, out[:n])
        call, least = at(rows), at(2)
        if call is None or least is None or \
                call[:3] + call[4:5] + call[6:] != least[:3] + least[4:5] + least[6:] or \
                live is not None and (live.shape != (1,) or not live.flags.c_contiguous):
            return None
        extra = [] if live is None else [live.ctypes.data]
    if call is None:
        return None
    routine, flag_a, flag_b, m, n, k, lda, ldb, ldc = call
    return [native_blas.address(routine, a.dtype), routine, flag_a, flag_b, m, n, k,
            a.ctypes.data, lda, b.ctypes.data, ldb, out.ctypes.data, ldc] + extra


def prepare_segment(function, size, members, statements, graphs, fed=()):
    """A segment's C function `function` as a function of `step` and the arrays fed to
    the step it reads, its table of `size` slots made now: the CSR's slots first (for
    each of `graphs`: graph, csr, other column, vertices, index dtype), then the fed
    arrays' (each of `fed`: shape, dtype), then each statement's (`members`). The C
    returns how many statements it ran; `statements` (each a function of `step` and the
    fed arrays) run the rest, and all of them where a statement does not run as C, a CSR
    does not fit or a fed array is not of the shape and dtype rendered."""
    def one_by_one(step, *given):
        for statement in statements:
            statement(step, *given)
    if any(member is None for member in members):
        return one_by_one
    first_fed = 2 * len(graphs)
    table = np.array([0] * (first_fed + len(fed)) + [v for m in members for v in m], np.int64)
    if table.size != size:
        raise RuntimeError(f"a segment's table has {table.size} slots; its C reads {size}")
    address, count = table.ctypes.data, len(statements)
    last_csr, last_fed = [None] * len(graphs), [None] * len(fed)

    def run(step, *given):
        done = 0
        for k, (graph, csr, other, rows, index_dtype) in enumerate(graphs):
            addresses = csr_addresses(graph, csr, other, rows, index_dtype)
            if addresses is None:
                break
            if addresses is not last_csr[k]:
                table[2 * k:2 * k + 2] = addresses
                last_csr[k] = addresses     # kept: no later tuple takes its identity
        else:
            for k, array in enumerate(given):
                if array is not last_fed[k]:
                    shape, dtype = fed[k]
                    if not rendered_for(array, shape, dtype):
                        break
                    table[first_fed + k] = array.ctypes.data
                    last_fed[k] = array     # kept alive while its address is used
            else:
                done = function(address, step)
        if done < count:
            for statement in statements[done:]:
                statement(step, *given)
    run.arrays = (table, members)
    return run
