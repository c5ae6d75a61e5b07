"""Calibration: measures this machine's rates for the cost model and writes a profile.

Each rate is the best of a few timed repetitions of the primitive the NumPy transformer
runs (the best, because other processes on a shared machine only ever slow a run down, so
it is the figure of this machine alone; benchmarks/bench_simulate.py compares it with the
fastest measured step): the tall, thin matrix products of a GNN layer, forward and weight
gradient (flop/s), an element-wise add (bytes/s), a Philox dropout (elements/s), np.take of
random rows (bytes/s), a SciPy CSR-dense product (multiply-adds/s), a segment maximum by
np.maximum.reduceat (elements/s), and a NumPy transformer program on tiny tensors
(seconds per step).
`quick=True` uses small sizes, for tests. Communication is not measured: the profile's
link is an estimate for shared-memory MPI on one machine (see `calibrate`)."""
import os
import time

import numpy as np
import scipy.sparse as sp

from .. import philox
from .topology import Device, Link, Topology


def default_profile_path():
    """Where `ngnn calibrate` writes and `ngnn simulate` reads: under NGNN_CACHE_DIR, else
    ~/.cache/ngnn."""
    root = os.environ.get("NGNN_CACHE_DIR") or os.path.join(os.path.expanduser("~"),
                                                            ".cache", "ngnn")
    return os.path.join(root, "profile.json")


def _best(run, repeats):
    run()                      # warm caches and allocations
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def measure(quick=False, seed=0):
    """{rate name: value} for this machine."""
    rng = np.random.default_rng(seed)
    rows, width = (20000, 32) if quick else (200000, 64)
    edges = 10 * rows
    repeats = 3 if quick else 7
    a = rng.standard_normal((rows, width), dtype=np.float32)
    w = rng.standard_normal((width, width), dtype=np.float32)
    out = np.empty_like(a)
    grad = np.empty_like(w)
    products = _best(lambda: (np.dot(a, w, out=out), np.dot(a.T, out, out=grad)), repeats)
    flops = 4 * rows * width * width / products
    bandwidth = 3 * a.nbytes / _best(lambda: np.add(a, a, out=out), repeats)
    index = rng.integers(0, rows, edges)
    gathered = np.empty((edges, width), np.float32)
    gather = 2 * gathered.nbytes / _best(lambda: np.take(a, index, axis=0, out=gathered),
                                         repeats)
    dst = np.sort(rng.integers(0, rows, edges))
    incidence = sp.csr_matrix((np.ones(edges, np.float32), (dst, np.arange(edges))),
                              shape=(rows, edges))
    spmm = edges * width / _best(lambda: incidence @ gathered, repeats)
    starts = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
    segment = edges * width / _best(lambda: np.maximum.reduceat(gathered, starts, axis=0),
                                    repeats)
    dropout = a.size / _best(lambda: philox.dropout(a, seed, 0, 0.5, out), repeats)
    overhead = call_overhead(repeats)
    return {"flops": flops, "memory_bandwidth": bandwidth, "gather_bandwidth": gather,
            "spmm_rate": spmm, "segment_rate": segment, "dropout_rate": dropout,
            "call_overhead": overhead}


def call_overhead(repeats, length=200):
    """Seconds per step of a NumPy transformer program on tiny tensors: a chain of
    element-wise ops compiled by the transformer, timed per call and divided by its steps
    (so the call's own fixed cost is spread over them)."""
    import ngnn as ng
    from ngnn import transformers as ngt
    from .cost import LEAVES
    transformer = ngt.make_transformer("numpy")
    try:
        x = ng.placeholder((4,), np.float32)
        y = x
        for i in range(length):
            y = ng.exp(-y) if i % 2 else y * 0.5
        comp = transformer.computation(y, x)
        comp.transform()
        steps = sum(1 for step in comp.steps if not isinstance(step, LEAVES))
        feed = np.ones(4, np.float32)
        return _best(lambda: comp(feed), repeats) / steps
    finally:
        transformer.close()


def calibrate(path=None, quick=False):
    """Measures this machine and writes its profile to `path` (default
    `default_profile_path()`) atomically; returns (topology, path)."""
    rates = measure(quick)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    device = Device("cpu", memory_bytes=memory, name="this machine", **rates)
    # Shared-memory MPI on one machine: latency and bandwidth of a memory copy.
    link = Link(latency=20e-6, bandwidth=rates["memory_bandwidth"] / 2)
    topology = Topology([device], [link], name="calibrated here" + (" (quick)" if quick
                                                                    else ""))
    path = path or default_profile_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    topology.save(path)
    return topology, path
