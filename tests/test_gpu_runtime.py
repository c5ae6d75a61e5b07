"""The GPU runtime layer: the dialect prelude, Philox on host and device, the OpenCL runtime
(PoCL on machines without a GPU), nvcc compiles of the CUDA renderings, the compile cache."""
import gc
import os

import numpy as np
import pytest

from fake_pycuda import install_fake_pycuda
from ngnn import philox
from ngnn.transformers.gpu.runtime import (
    CompileCache, available_runtimes, compile_ptx, get_runtime, render_prelude,
    runtime_unavailable_reason)

# Written once, CUDA-style; rendered for both dialects below.
KERNELS = r"""
KERNEL void add_dropout(GLOBAL const float* RESTRICT a, GLOBAL const float* RESTRICT b,
                        GLOBAL float* RESTRICT out, int n, uint threshold, float scale,
                        ulong seed, ulong stream) {
    int i = GLOBAL_ID(0);
    if (i >= n) return;
    uint keep = philox_word(seed, (ulong)i, stream) >= threshold;
    out[i] = (a[i] + b[i]) * scale * (float)keep;
}

KERNEL void uniform_fill(GLOBAL float* out, int n, ulong seed, ulong base, ulong stream) {
    int i = GLOBAL_ID(0);
    if (i < n) out[i] = philox_uniform(seed, base + (ulong)i, stream);
}

KERNEL void philox_block(GLOBAL ulong* out, ulong c0, ulong c1, ulong c2, ulong c3, ulong k0,
                         ulong k1) {
    ulong ctr[4];
    ctr[0] = c0; ctr[1] = c1; ctr[2] = c2; ctr[3] = c3;
    philox4x64_10(ctr, k0, k1);
    for (int j = 0; j < 4; ++j) out[j] = ctr[j];
}

/* One row per work-group row: a local-memory tree sum per work-group, and the index macros. */
KERNEL void row_stats(GLOBAL const float* RESTRICT x, int ncols, GLOBAL float* partial_sums,
                      GLOBAL int* geometry) {
    LOCAL float tile[64];
    int col = GLOBAL_ID(0);
    int row = GLOBAL_ID(1);
    int lid = LOCAL_ID(0);
    float v = col < ncols ? x[row * ncols + col] : 0.0f;
    tile[lid] = v;
    BARRIER();
    for (int stride = LOCAL_SIZE(0) / 2; stride > 0; stride /= 2) {
        if (lid < stride) tile[lid] += tile[lid + stride];
        BARRIER();
    }
    if (lid == 0) partial_sums[row * NUM_GROUPS(0) + GROUP_ID(0)] = tile[0];
    if (col == 0 && row == 0) {
        geometry[0] = NUM_GROUPS(0);
        geometry[1] = NUM_GROUPS(1);
        geometry[2] = LOCAL_SIZE(1);
        geometry[3] = GROUP_ID(1) + LOCAL_ID(1);
    }
}
"""
KERNEL_NAMES = ["add_dropout", "uniform_fill", "philox_block", "row_stats"]

M64 = 2 ** 64 - 1
# Random123's known answers for Philox4x64-10.
KAT = [((0, 0, 0, 0), (0, 0),
        (0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B, 0x7E68B68AEC7BA23B)),
       ((M64,) * 4, (M64, M64),
        (0x87B092C3013FE90B, 0x438C3C67BE8D0224, 0x9CC7D7C69CD777B6, 0xA09CAEBF594F0BA0))]


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    runtime = get_runtime("opencl", cache=CompileCache(tmp_path_factory.mktemp("cl-cache")))
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def kernels(rt):
    return rt.build(render_prelude(rt.dialect) + KERNELS, KERNEL_NAMES)


def upload(rt, array):
    buf = rt.alloc(array.nbytes)
    rt.write(buf, 0, array)
    return buf


def download(rt, buf, dtype, n):
    out = np.empty(n, dtype)
    rt.read(buf, 0, out)
    return out


def test_prelude_renders_each_dialect():
    cuda, opencl = render_prelude("cuda"), render_prelude("opencl")
    assert 'extern "C" __global__' in cuda and "__syncthreads()" in cuda
    assert "#define KERNEL __kernel" in opencl and "get_global_id" in opencl
    for text in (cuda, opencl):
        assert "philox_uniform(" in text and "{{" not in text and "{%" not in text
    with pytest.raises(ValueError, match="dialect"):
        render_prelude("metal")


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_philox_known_answers(counter, key, expected):
    assert [int(w) for w in philox.philox4x64_10(counter, key)] == list(expected)


def test_vectorized_philox_is_numpys_philox():
    counters = np.array([1, 7, 2 ** 63, M64 - 1], dtype=np.uint64)
    mine = np.stack(philox.philox4x64_10((counters, 3, 5, 7), (11, 13)), axis=-1)
    for c, row in zip(counters, mine):
        bits = np.random.Philox(counter=np.array([int(c) - 1, 3, 5, 7], np.uint64),
                                key=np.array([11, 13], np.uint64))
        assert bits.random_raw(4).tolist() == row.tolist()


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_device_philox_known_answers(rt, kernels, counter, key, expected):
    out = rt.alloc(32)
    args = [out] + [np.uint64(w) for w in counter + key]
    rt.launch(kernels["philox_block"], (1,), (1,), args)
    assert download(rt, out, np.uint64, 4).tolist() == list(expected)


@pytest.mark.parametrize("seed, base, stream", [
    (0, 0, 0), (12345, 7, 0), (2 ** 64 - 1, 2 ** 32 - 100, 3),  # crosses 2**32
    (0xDEADBEEF12345678, 2 ** 64 - 256, 2 ** 64 - 1),            # the last positions
])
def test_device_uniform_matches_numpy_bitwise(rt, kernels, seed, base, stream):
    n = 256
    out = rt.alloc(4 * n)
    rt.launch(kernels["uniform_fill"], (n,), (64,),
              [out, np.int32(n), np.uint64(seed), np.uint64(base), np.uint64(stream)])
    device = download(rt, out, np.float32, n)
    host = philox.uniform(seed, base, n, stream)
    assert device.view(np.uint32).tolist() == host.view(np.uint32).tolist()
    assert 0.0 <= host.min() and host.max() < 1.0


def test_uniform_statistics_and_validation():
    u = philox.uniform(42, 0, 100_000)
    assert u.dtype == np.float32 and abs(u.mean() - 0.5) < 0.01
    assert not np.array_equal(u[:100], philox.uniform(43, 0, 100))
    assert not np.array_equal(u[:100], philox.uniform(42, 0, 100, stream=1))
    np.testing.assert_array_equal(u[10:20], philox.uniform(42, 10, 10))
    positions = [13, 3, 5, 99_999, 4]     # any order: each takes its word of its counter
    np.testing.assert_array_equal(philox.uniform_at(42, positions), u[positions])
    with pytest.raises(ValueError, match="seed"):
        philox.uniform(-1, 0, 4)
    with pytest.raises(ValueError, match="n must"):
        philox.uniform(0, 0, -1)
    with pytest.raises(ValueError, match="rate"):
        philox.keep_threshold(1.0)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.6, 0.999])
def test_keep_threshold_is_the_float_comparison(rate):
    t = philox.keep_threshold(rate)
    words = np.array([min(max(w, 0), 2 ** 32 - 1) for w in
                      (0, 255, 256, 2 ** 32 - 1, t - 1, t, t + 255)], dtype=np.uint32)
    np.testing.assert_array_equal(words >= np.uint32(philox.keep_threshold(rate)),
                                  philox.to_uniform(words) >= np.float32(rate))


def test_add_dropout_matches_numpy(rt, kernels):
    n, rate, seed, stream = 1000, 0.3, 99, 2 ** 40 + 3
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = rt.alloc(4 * n)
    padded = -(-n // 128) * 128  # the caller rounds the global size up; the kernel guards i < n
    scale = philox.keep_scale(rate, np.float32)
    rt.launch(kernels["add_dropout"], (padded,), (128,),
              [upload(rt, a), upload(rt, b), out, np.int32(n),
               np.uint32(philox.keep_threshold(rate)), scale, np.uint64(seed),
               np.uint64(stream)])
    rt.synchronize()
    expected = philox.dropout(a + b, seed, stream, rate, np.empty(n, np.float32))
    assert download(rt, out, np.float32, n).tolist() == expected.tolist()


def test_local_memory_and_2d_indexing(rt, kernels):
    rows, ncols, local = 5, 150, 64
    x = np.random.default_rng(1).standard_normal((rows, ncols)).astype(np.float32)
    groups = -(-ncols // local)
    partial_sums = rt.alloc(4 * rows * groups)
    geometry = rt.alloc(16)
    rt.launch(kernels["row_stats"], (groups * local, rows), (local, 1),
              [upload(rt, x), np.int32(ncols), partial_sums, geometry])
    sums = download(rt, partial_sums, np.float32, rows * groups).reshape(rows, groups).sum(1)
    np.testing.assert_allclose(sums, x.sum(1), rtol=1e-5, atol=1e-5)
    assert download(rt, geometry, np.int32, 4).tolist() == [groups, rows, 1, 0]


def test_cuda_rendering_compiles_with_nvcc(tmp_path):
    ptx = compile_ptx({"kernels": render_prelude("cuda") + KERNELS}, arch="sm_80",
                      cache=CompileCache(tmp_path))
    for name in KERNEL_NAMES:
        assert f".entry {name}(" in ptx["kernels"]


def test_nvcc_batches_and_reports_errors(tmp_path):
    cache = CompileCache(tmp_path)
    good = {f"k{i}": f'extern "C" __global__ void k{i}(float* x) {{ x[0] = {i}.0f; }}'
            for i in range(3)}
    ptx = compile_ptx(good, cache=cache)
    assert list(ptx) == list(good) and all(".entry" in text for text in ptx.values())
    assert (cache.hits, cache.misses) == (0, 3)
    compile_ptx(good, cache=cache)
    assert cache.hits == 3
    with pytest.raises(RuntimeError, match=r"nvcc failed for broken(.|\n)*1 \| extern"):
        compile_ptx({"broken": 'extern "C" __global__ void f() { int x = ; }'}, cache=cache)


def test_second_build_hits_cache_and_writes_atomically(tmp_path):
    source = render_prelude("opencl") + KERNELS
    cache = CompileCache(tmp_path)
    with get_runtime("opencl", cache=cache) as first:
        first.build(source, ["uniform_fill"])
    assert (cache.hits, cache.misses) == (0, 1)
    with get_runtime("opencl", cache=cache) as second:
        fill = second.build(source, ["uniform_fill"])["uniform_fill"]
        out = second.alloc(64)
        second.launch(fill, (16,), (16,), [out, np.int32(16), np.uint64(5), np.uint64(0),
                                           np.uint64(0)])
        np.testing.assert_array_equal(download(second, out, np.float32, 16), philox.uniform(5, 0, 16))
    assert (cache.hits, cache.misses) == (1, 1)
    entries = os.listdir(tmp_path)
    assert len(entries) == 1 and entries[0].endswith(".bin")


def test_cache_put_get_and_env_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("NGNN_CACHE_DIR", str(tmp_path / "env-cache"))
    cache = CompileCache()
    assert cache.directory == tmp_path / "env-cache"
    key = cache.key("opencl", "device", "source")
    assert key != cache.key("opencl", "devices", "ource")
    assert cache.get(key) is None
    cache.put(key, b"\x00binary")
    cache.put(key, b"\x00binary2")
    assert cache.get(key) == b"\x00binary2"
    assert os.listdir(cache.directory) == [f"{key}.bin"]


def test_build_errors_show_log_and_numbered_source(rt):
    with pytest.raises(RuntimeError, match=r"OpenCL build failed(.|\n)*\| KERNEL void broken"):
        rt.build(render_prelude("opencl") + "KERNEL void broken(GLOBAL float* x) { x[0] = ; }",
                 ["broken"])
    with pytest.raises(RuntimeError, match="'missing' is not defined"):
        rt.build(render_prelude("opencl") + KERNELS, ["missing"])


def test_zero_size_and_offset_copies(rt):
    empty = rt.alloc(0)
    assert empty.nbytes == 0
    rt.write(empty, 0, np.empty(0, np.float32))
    rt.read(empty, 0, np.empty(0, np.float32))
    rt.fill_zero(empty)
    buf = rt.alloc(40)
    rt.fill_zero(buf)
    rt.write(buf, 12, np.arange(1, 5, dtype=np.float32))
    np.testing.assert_array_equal(download(rt, buf, np.float32, 10), [0, 0, 0, 1, 2, 3, 4, 0, 0, 0])
    part = np.empty(2, np.float32)
    rt.read(buf, 16, part)
    np.testing.assert_array_equal(part, [2, 3])
    with pytest.raises(ValueError, match="does not fit"):
        rt.write(buf, 32, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        rt.read(buf, 0, np.empty((4, 2), np.float32)[:, 0])


def test_launch_validation(rt, kernels):
    out = rt.alloc(64)
    args = [out, np.int32(16), np.uint64(1), np.uint64(0), np.uint64(0)]
    with pytest.raises(ValueError, match="multiple"):
        rt.launch(kernels["uniform_fill"], (20,), (16,), args)
    with pytest.raises(TypeError, match="argument 1"):
        rt.launch(kernels["uniform_fill"], (16,), (16,), [out, 16] + args[2:])


def test_runtime_selection_and_errors():
    assert "opencl" in available_runtimes()
    with get_runtime() as chosen:
        assert chosen.name == chosen.dialect == available_runtimes()[0]
        assert chosen.device_name
    with pytest.raises(ValueError, match="unknown GPU runtime"):
        get_runtime("metal")
    if runtime_unavailable_reason("cuda") is not None:
        with pytest.raises(RuntimeError, match=r"cuda GPU runtime is unavailable(.|\n)*ngnn\[cuda\]"):
            get_runtime("cuda")


def test_cuda_runtime_drives_pycuda(monkeypatch, tmp_path):
    """CUDARuntime against a fake pycuda: allocations, copies with offsets, compile options,
    and launch geometry (grid = global / local, block = local) without an NVIDIA GPU."""
    fake = install_fake_pycuda(monkeypatch)
    from ngnn.transformers.gpu.runtime.cuda import CUDARuntime

    cuda = CUDARuntime(cache=CompileCache(tmp_path), options=["-O3"])
    assert (cuda.device_name, cuda.arch, cuda.dialect) == ("Fake GPU", "sm_86", "cuda")
    # The primary context (PyTorch's and CuPy's), current on this thread.
    assert fake.calls[1:3] == [("retain_primary_context",), ("push",)]
    buf = cuda.alloc(40)
    empty = cuda.alloc(0)
    assert (buf.nbytes, empty.nbytes) == (40, 0)
    assert ("alloc", 1) in fake.calls              # zero-byte buffers still get a pointer
    cuda.fill_zero(buf)
    cuda.write(buf, 8, np.arange(1, 4, dtype=np.float32))
    assert ("htod", buf.handle + 8, 12) in fake.calls
    part = np.empty(2, np.float32)
    cuda.read(buf, 12, part)
    assert part.tolist() == [2, 3] and ("dtoh", buf.handle + 12, 8) in fake.calls
    other = cuda.alloc(8)
    other_address = int(other.handle)
    cuda.copy(other, 4, buf, 8, 4)
    assert ("dtod", other.handle + 4, buf.handle + 8, 4) in fake.calls
    assert download(cuda, other, np.float32, 2).tolist() == [0, 1]

    source = render_prelude("cuda") + "KERNEL void scale(float* x) { x[0] *= 2.0f; }"
    kernels = cuda.build(source, ["scale"])
    assert ("compile", ["-O3"], True, "sm_86", False) in fake.calls
    cuda.build(source, ["scale"])                  # the second build comes from the cache
    assert sum(call[0] == "compile" for call in fake.calls) == 1
    with pytest.raises(RuntimeError, match="'missing' is not defined"):
        cuda.build(source, ["missing"])
    cuda.launch(kernels["scale"], (256, 6), (64, 2), [buf, np.int32(3)])
    launch = [call for call in fake.calls if call[0] == "launch"][-1]
    assert launch[1] == (buf.handle, np.int32(3))
    assert (launch[2], launch[3]) == ((64, 2, 1), (4, 3, 1))
    assert cuda.memory_limits() == (80 << 30, 80 << 30)
    cuda.free(other)
    assert fake.calls[-1] == ("free", other_address) and other.handle is None
    cuda.close()
    assert fake.calls[-1] == ("detach",)
    cuda.close()
    assert fake.calls.count(("detach",)) == 1
    # A runtime never closed still leaves PyCUDA's context stack empty (else PyCUDA aborts
    # the process at exit): collected here; the interpreter's exit does the same.
    forgotten = CUDARuntime(cache=CompileCache(tmp_path))
    del forgotten
    gc.collect()
    assert fake.calls.count(("detach",)) == 2


def test_cuda_prepared_launches_bind_once_and_time_on_request(monkeypatch, tmp_path):
    """A prepared CUDA launch fixes grid, block and the argument format once; later runs
    are prepared calls on the runtime's stream, with rebound arguments, and an event pair
    around each when timed."""
    fake = install_fake_pycuda(monkeypatch)
    from ngnn.transformers.gpu.runtime.cuda import CUDARuntime
    cuda = CUDARuntime(cache=CompileCache(tmp_path))
    source = render_prelude("cuda") + "KERNEL void scale(float* x, uint n) { x[0] *= n; }"
    (kernel,) = cuda.build(source, ["scale"]).values()
    first, second = cuda.alloc(16), cuda.alloc(16)
    launch = cuda.prepare(kernel, (256,), (64,), [None, np.uint32(2)], timed=True)
    assert kernel.handle.arg_types == ["P", np.dtype(np.uint32)]
    with pytest.raises(TypeError, match="kernel argument 1 is int"):
        launch.set_arg(1, 3)
    assert launch.seconds() is None                 # not run yet
    launch.set_arg(0, first)
    launch.run()
    launch.set_arg(0, second)
    launch.run()
    prepared = [call for call in fake.calls if call[0] == "prepared"]
    assert [call[2][0] for call in prepared] == [int(first.handle), int(second.handle)]
    assert prepared[0][3:] == ((64, 1, 1), (4, 1, 1))
    assert launch.seconds() == pytest.approx(5e-4)
    assert fake.calls.count(("event",)) == 4
    assert cuda.prepare(kernel, (64,), (64,), [first, np.uint32(1)]).seconds() is None
    cuda.write(first, 0, np.ones(4, np.float32))
    cuda.read(first, 0, np.empty(2, np.float32))
    assert cuda.transferred == {"to_device": 16, "from_device": 8}
    cuda.close()


def test_opencl_prepared_launches_rebind_and_time(rt, kernels):
    a = rt.alloc(64 * 4)
    launch = rt.prepare(kernels["uniform_fill"], (64,), (64,),
                        [None, np.int32(64), np.uint64(5), np.uint64(0), np.uint64(0)])
    assert launch.seconds() is None
    for buffer in (a, rt.alloc(64 * 4)):
        launch.set_arg(0, buffer)
        launch.run()
        np.testing.assert_array_equal(download(rt, buffer, np.float32, 64),
                                      philox.uniform(5, 0, 64))
    assert launch.seconds() > 0


def test_two_gpu_transformers_alive_at_once_take_turns():
    """Two GPU transformers (a runtime each) alive at once, their calls interleaved, with
    PyTorch's CUDA work between them where PyTorch has a device: on CUDA each runtime once
    made a context of its own current, and the other's launches then failed ("invalid
    resource handle"). Runs on the default runtime: CUDA where a device is present."""
    import ngnn as ng
    from ngnn import transformers as ngt
    x = ng.placeholder((5, 3), name="x")
    y = ng.relu(x) * 2.0
    values = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    try:
        import torch
        torch_cuda = torch.cuda.is_available()
    except ImportError:
        torch_cuda = False
    with ngt.make_transformer("gpu") as first, ngt.make_transformer("gpu") as second:
        steps = [first.computation([y], x), second.computation([y], x)]
        for step in steps + steps:
            if torch_cuda:      # PyTorch makes its own (the primary) context current
                torch.ones(3, device="cuda").sum().item()
            np.testing.assert_array_equal(step(values)[0], np.maximum(values, 0) * 2)
