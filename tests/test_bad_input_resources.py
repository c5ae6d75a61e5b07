"""Crashes from deep inside, and resources of long-running processes: damaged compile-cache
entries, device memory limits, deep graphs, closing transformers, bounded caches."""
import gc
import linecache
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.transformers.gpu.runtime import CompileCache, get_runtime, render_prelude
from ngnn.transformers.gpu.runtime.cache import STALE_SECONDS

GPU = "gpu" in ngt.transformer_choices()
needs_gpu = pytest.mark.skipif(not GPU, reason="no GPU runtime (OpenCL or CUDA) here")

KERNEL = "KERNEL void twice(GLOBAL float* x) { x[GLOBAL_ID(0)] *= 2.0f; }"


# ---- the compile cache ------------------------------------------------------------------------

def damage_truncate(data):
    return data[:len(data) // 2]


def damage_flip(data):
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def damage_empty(data):
    return b""


def damage_header_only(data):
    return data[:48]


def damage_old_format(data):
    return data[48:]         # the bytes without a header, as older ngnn wrote them


def damage_longer(data):
    return data + b"\x00" * 16


DAMAGES = [damage_truncate, damage_flip, damage_empty, damage_header_only, damage_old_format,
           damage_longer]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cache_entry_is_a_miss_and_is_removed(tmp_path, damage):
    cache = CompileCache(tmp_path)
    key = cache.key("entry")
    cache.put(key, b"binary bytes " * 100)
    path = tmp_path / f"{key}.bin"
    path.write_bytes(damage(path.read_bytes()))
    assert cache.get(key) is None
    assert (cache.corrupt, cache.misses) == (1, 1) and not path.exists()
    cache.put(key, b"fresh")
    assert cache.get(key) == b"fresh"


@needs_gpu
@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_old_format])
def test_a_damaged_kernel_binary_is_rebuilt(tmp_path, damage):
    source = render_prelude("opencl") + KERNEL
    with get_runtime("opencl", cache=CompileCache(tmp_path)) as first:
        first.build(source, ["twice"])
    (entry,) = tmp_path.glob("*.bin")
    entry.write_bytes(damage(entry.read_bytes()))
    cache = CompileCache(tmp_path)
    with get_runtime("opencl", cache=cache) as second:
        twice = second.build(source, ["twice"])["twice"]
        buffer = second.alloc(16)
        second.write(buffer, 0, np.arange(4, dtype=np.float32))
        second.launch(twice, (4,), (4,), [buffer])
        out = np.empty(4, np.float32)
        second.read(buffer, 0, out)
    np.testing.assert_array_equal(out, [0, 2, 4, 6])
    assert cache.corrupt == 1
    assert CompileCache(tmp_path).get(entry.stem) is not None     # replaced by a good entry


def test_stale_temporary_files_are_removed(tmp_path):
    stale, fresh = tmp_path / ".tmp-stale", tmp_path / ".tmp-fresh"
    stale.write_bytes(b"left by a writer that died")
    fresh.write_bytes(b"being written right now")
    old = time.time() - STALE_SECONDS - 60
    os.utime(stale, (old, old))
    CompileCache(tmp_path)
    assert not stale.exists() and fresh.exists()


def test_a_missing_cache_directory_is_fine(tmp_path):
    cache = CompileCache(tmp_path / "not" / "there")
    assert cache.get(cache.key("x")) is None


# ---- device memory limits ---------------------------------------------------------------------

@pytest.fixture
def small_device(monkeypatch):
    """A GPU transformer whose device reports 1 MiB of memory and 256 KiB per allocation."""
    t = ngt.make_transformer("gpu")
    monkeypatch.setattr(t.runtime, "memory_limits", lambda: (1 << 20, 1 << 18))
    yield t
    t.close()


@needs_gpu
def test_a_placeholder_larger_than_one_allocation(small_device):
    x = ng.placeholder((300, 256), name="features")
    comp = small_device.computation(ng.sum(x), x)
    with pytest.raises(MemoryError, match=r"placeholder <Placeholder 'features' \[300, 256\] "
                                          r"float32> needs 307200 bytes.*allows \(262144 bytes"):
        comp(np.zeros((300, 256), np.float32))


@needs_gpu
def test_a_variable_larger_than_one_allocation(small_device):
    x = ng.placeholder((2, 400), name="x")
    w = ng.variable((400, 200), name="weights")
    comp = small_device.computation(ng.dot(x, w), x)
    with pytest.raises(MemoryError, match=r"variable <Variable 'weights' \[400, 200\] float32> "
                                          r"needs 320000 bytes"):
        comp(np.zeros((2, 400), np.float32))


@needs_gpu
def test_an_intermediate_larger_than_one_allocation(small_device):
    a = ng.placeholder((300, 1), name="a")
    b = ng.placeholder((1, 300), name="b")
    comp = small_device.computation(ng.sum(ng.exp(ng.dot(a, b))), a, b)
    with pytest.raises(MemoryError, match=r"the intermediate buffer of <Dot \[300, 300\] "
                                          r"float32> needs 360000 bytes"):
        comp(np.zeros((300, 1), np.float32), np.zeros((1, 300), np.float32))


@needs_gpu
def test_more_than_the_device_memory_in_total(small_device):
    xs = [ng.placeholder((250, 250), name=f"x{i}") for i in range(5)]
    comp = small_device.computation([ng.sum(x) for x in xs], *xs)
    with pytest.raises(MemoryError, match=r"needs \d+ bytes of device memory.*more than the "
                                          r"1048576 bytes"):
        comp(*[np.zeros((250, 250), np.float32)] * 5)


def test_an_intermediate_larger_than_the_machine(transformer_factory):
    a = ng.placeholder((1 << 20, 1), name="a")
    b = ng.placeholder((1, 1 << 20), name="b")
    comp = transformer_factory().computation(ng.sum(ng.exp(ng.dot(a, b))), a, b)
    with pytest.raises(MemoryError, match=r"the intermediate buffer of <Dot \[1048576, 1048576\] "
                                          r"float32>.* needs 4398046511104 bytes"):
        comp.transform()


@needs_gpu
def test_the_real_device_limit_is_checked():
    t = ngt.make_transformer("gpu")
    total, largest = t.runtime.memory_limits()
    rows = largest // (4 * 1024) + 1
    x = ng.placeholder((rows, 1024), name="huge")
    with pytest.raises(MemoryError, match=rf"placeholder <Placeholder 'huge' \[{rows}, 1024\]"):
        t.computation(ng.sum(x), x).transform()
    t.close()


# Run in a child process: a driver that aborts (PoCL did, on an allocation it could not
# make) must fail the test, not end pytest.
ISOLATED_PRELUDE = """
import resource
import sys
import ngnn as ng
from ngnn import transformers as ngt
from ngnn.transformers.gpu.runtime import DeviceMemoryError
t = ngt.make_transformer("gpu")
total, largest = t.runtime.memory_limits()
"""


def run_isolated(body):
    return subprocess.run([sys.executable, "-c", ISOLATED_PRELUDE + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=300)


@needs_gpu
def test_a_buffer_larger_than_one_allocation_asked_of_the_runtime():
    result = run_isolated("""
        try:
            t.runtime.alloc(largest + 1, "buffer 'huge'")
        except DeviceMemoryError as error:
            print("error:", error)
        """)
    assert result.returncode == 0, result.stderr
    assert re.search(r"error: buffer 'huge' needs (\d+) bytes .*, more than the largest single "
                     r"allocation the device '.+' allows \((\d+) bytes", result.stdout)


@needs_gpu
def test_more_than_the_process_can_map_is_an_error_not_an_abort():
    """An intermediate within the device's limits, but beyond the address space the process
    may still map (ulimit -v): PoCL aborted at the first launch that wrote it
    (pocl_create_migration_commands, signal 6)."""
    result = run_isolated("""
        import os
        import numpy as np
        nbytes = min(largest, total, 1 << 31)
        rows = nbytes // (4 * 1024)
        a = ng.placeholder((rows, 1), name="a")
        b = ng.placeholder((1, 1024), name="b")
        comp = t.computation(ng.sum(ng.exp(ng.dot(a, b))), a, b)
        mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + nbytes // 2, resource.RLIM_INFINITY))
        try:
            comp(np.zeros((rows, 1), np.float32), np.zeros((1, 1024), np.float32))
        except DeviceMemoryError as error:
            print("error:", error)
        """)
    assert result.returncode == 0, result.stderr
    assert re.search(r"error: the intermediate buffer of <Dot \[\d+, 1024\] float32> needs "
                     r"\d+ bytes .*which the device '.+' could not allocate", result.stdout), \
        result.stdout


# ---- deep graphs ------------------------------------------------------------------------------

def test_a_chain_of_1500_elementwise_ops(transformer_factory):
    x = ng.placeholder((4,), name="x")
    y = x
    for _ in range(1500):
        y = y * 1.001 + 0.0001
    values = np.linspace(-1, 1, 4).astype(np.float32)
    expected = values.astype(np.float64)
    for _ in range(1500):
        expected = expected * 1.001 + 0.0001
    out = transformer_factory().computation(y, x)(values)
    np.testing.assert_allclose(out, expected, rtol=1e-4)


def test_the_gradient_of_a_chain_of_20_ops(transformer_factory):
    x = ng.placeholder((4,), name="x")
    y = x
    for _ in range(20):
        y = ng.tanh(y) * 1.5 + 0.1
    comp = transformer_factory().computation([y, ng.grad(ng.sum(y), x)], x)
    values = np.linspace(-1, 1, 4).astype(np.float32)
    expected, slope = values.astype(np.float64), np.ones(4)
    for _ in range(20):
        slope *= 1.5 * (1 - np.tanh(expected) ** 2)
        expected = np.tanh(expected) * 1.5 + 0.1
    out, grad = comp(values)
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    np.testing.assert_allclose(grad, slope, rtol=1e-3, atol=1e-30)


def test_a_long_chain_inside_zoom_in(transformer_factory):
    g = ng.Graph.from_edges([0, 1, 2], [1, 2, 0], num_nodes=3)
    h = ng.placeholder((3, 2), name="h")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        r = sum(n.h for n in v.innbs)
        for _ in range(500):
            r = r * 1.001 + 0.0
    out = transformer_factory().computation(ng.zoomOut(r), h)(np.ones((3, 2), np.float32))
    np.testing.assert_allclose(out, np.full((3, 2), 1.001 ** 500), rtol=1e-4)


# ---- closing, caches, linecache ----------------------------------------------------------------

def test_a_closed_transformer_refuses_calls(transformer_factory):
    x = ng.placeholder((2,), name="x")
    t = transformer_factory()
    comp = t.computation(x * 2.0, x)
    comp(np.ones(2, np.float32))
    t.close()
    with pytest.raises(RuntimeError, match="the transformer is closed"):
        comp(np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match="the transformer is closed"):
        t.computation(x, x)
    w = ng.variable((2,), name="w")
    with pytest.raises(RuntimeError, match="the transformer is closed"):
        t.set_variable(w, np.zeros(2))
    with pytest.raises(RuntimeError, match="the transformer is closed"):
        t.variable_value(w)


@needs_gpu
def test_close_frees_every_device_buffer():
    x = ng.placeholder((64,), name="x")
    w = ng.variable((64,), initial_value=2.0, name="w")
    t = ngt.make_transformer("gpu")
    t.computation(ng.exp(x * w) + np.arange(64, dtype=np.float32), x)(np.ones(64, np.float32))
    storages = list(t.storages)
    assert len(storages) >= 3
    t.close()
    assert t.storages == [] and all(s.buffer.handle is None for s in storages)


def test_numpy_close_and_collection_drop_linecache_entries():
    x = ng.placeholder((2,), name="x")
    t = ngt.make_transformer("numpy")
    comp = t.computation(x + 1.0, x)
    comp(np.ones(2, np.float32))
    name = comp.source_file
    assert name in linecache.cache
    t.close()
    assert name not in linecache.cache

    t = ngt.make_transformer("numpy")
    comp = t.computation(x + 2.0, x)
    comp(np.ones(2, np.float32))
    name = comp.source_file
    del comp, t
    gc.collect()
    assert name not in linecache.cache


def test_transformers_in_a_loop_keep_caches_bounded():
    from ngnn.transformers.gpu.transformer import BoundedCache
    cache = BoundedCache(3)
    for i in range(10):
        assert cache.remember(i % 5, lambda: i) is not None
    assert len(cache) == 3
    made = []
    assert list(cache) == [2, 3, 4] and cache[4] == 9
    assert cache.remember(4, lambda: made.append(1)) == 9 and not made     # a hit: not made
    x = ng.placeholder((2,), name="x")
    before = len(linecache.cache)
    for _ in range(20):
        with ngt.make_transformer("numpy") as t:
            t.computation(x * 3.0, x)(np.ones(2, np.float32))
    gc.collect()
    assert len(linecache.cache) <= before + 1
