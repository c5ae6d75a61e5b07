"""CUDA runtime through PyCUDA, for NVIDIA GPUs.

PyCUDA is imported when the runtime is created, never at module import, so machines without it
(or without a driver) can still import ngnn and use the OpenCL runtime.
"""
import weakref

from .base import (DeviceBuffer, DeviceMemoryError, Kernel, PreparedLaunch, Runtime,
                   check_copy, check_device_copy, check_kernel_argument, check_launch,
                   numbered_source)
from .cache import CompileCache


class CUDARuntime(Runtime):
    name = "cuda"
    dialect = "cuda"

    def __init__(self, device_index=0, cache=None, options=()):
        import pycuda.driver as drv
        self._drv = drv
        drv.init()
        if drv.Device.count() <= device_index:
            raise RuntimeError(f"CUDA device {device_index} not found "
                               f"({drv.Device.count()} device(s) present)")
        device = drv.Device(device_index)
        self.device_name = device.name()
        major, minor = device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.options = list(options)
        self._device = device
        # The device's primary context, the one the CUDA runtime API (PyTorch, CuPy) uses,
        # made current on this thread, where every call runs. A context of our own would be
        # displaced when PyTorch makes its context current, or when a second runtime made
        # its own, and our launches on its stream would fail ("invalid resource handle").
        context = device.retain_primary_context()
        context.push()
        self._stream = drv.Stream()
        # PyCUDA aborts the process at exit if a context is still on its stack: detach ours
        # when this runtime is closed, collected or the interpreter exits, whichever is first.
        self._release = weakref.finalize(self, release_context, context, self._stream)
        self.cache = cache if cache is not None else CompileCache()
        self.transferred = {"to_device": 0, "from_device": 0}

    def alloc(self, nbytes, what="a buffer"):
        nbytes = self.checked_size(nbytes, what)
        try:
            # cuMemAlloc rejects zero bytes; empty tensors still need a pointer to pass to
            # kernels.
            handle = self._drv.mem_alloc(max(1, nbytes))
        except self._drv.MemoryError as err:
            free, _ = self._drv.mem_get_info()
            raise DeviceMemoryError(
                f"{what} needs {nbytes} bytes ({nbytes / 2**30:.2f} GiB), more than the "
                f"{free} bytes ({free / 2**30:.2f} GiB) free on the device "
                f"{self.device_name!r} ({err})") from None
        return DeviceBuffer(nbytes, handle)

    def free(self, buffer):
        if buffer.handle is not None:
            buffer.handle.free()
            buffer.handle = None

    def memory_limits(self):
        total = int(self._device.total_memory())
        return total, total

    def write(self, buffer, offset_bytes, host_array):
        check_copy(buffer, offset_bytes, host_array, writable=False)
        if host_array.nbytes:
            # Kernels queued on our stream may still read this memory: let them finish first.
            self._stream.synchronize()
            self._drv.memcpy_htod(int(buffer.handle) + offset_bytes, host_array)
            self.count_transfer("to_device", host_array.nbytes)

    def read(self, buffer, offset_bytes, host_out_array):
        check_copy(buffer, offset_bytes, host_out_array, writable=True)
        if host_out_array.nbytes:
            self._stream.synchronize()
            self._drv.memcpy_dtoh(host_out_array, int(buffer.handle) + offset_bytes)
            self.count_transfer("from_device", host_out_array.nbytes)

    def copy(self, dst, dst_offset, src, src_offset, nbytes):
        check_device_copy(dst, dst_offset, src, src_offset, nbytes)
        if nbytes:
            # On our stream, so it runs after the kernels queued before it.
            self._drv.memcpy_dtod_async(int(dst.handle) + dst_offset,
                                        int(src.handle) + src_offset, nbytes, self._stream)

    def fill_zero(self, buffer):
        self._stream.synchronize()
        self._drv.memset_d8(int(buffer.handle), 0, max(1, buffer.nbytes))

    def build(self, source, kernel_names):
        from pycuda.compiler import compile as nvcc_compile
        key = self.cache.key("cuda", self.device_name, self.arch, " ".join(self.options), source)
        cubin = self.cache.get(key)
        if cubin is None:
            try:
                # no_extern_c: the prelude's KERNEL macro already declares kernels extern "C".
                # cache_dir=False: PyCUDA's own cache would duplicate ours.
                cubin = nvcc_compile(source, options=self.options, no_extern_c=True,
                                     arch=self.arch, cache_dir=False)
            except self._drv.CompileError as err:
                raise RuntimeError(f"CUDA build failed for {self.arch}:\n{err}\n"
                                   f"--- source ---\n{numbered_source(source)}") from None
            self.cache.put(key, cubin)
        module = self._drv.module_from_buffer(cubin)
        kernels = {}
        for name in kernel_names:
            try:
                kernels[name] = Kernel(name, module.get_function(name))
            except self._drv.LogicError:
                raise RuntimeError(f"kernel {name!r} is not defined in the built source") from None
        return kernels

    def launch(self, kernel, global_size, local_size, args):
        global_size, local_size = check_launch(global_size, local_size, args)
        grid, block = grid_and_block(global_size, local_size)
        native = [a.handle if isinstance(a, DeviceBuffer) else a for a in args]
        kernel.handle(*native, block=block, grid=grid, stream=self._stream)

    def prepare(self, kernel, global_size, local_size, args, timed=False):
        return CUDALaunch(self, kernel, global_size, local_size, args, timed)

    def synchronize(self):
        self._stream.synchronize()

    def close(self):
        self._release()


def grid_and_block(global_size, local_size):
    """CUDA's grid (work-groups per dimension) and block (the work-group), padded to 3-D."""
    pad = (1,) * (3 - len(local_size))
    return tuple(g // s for g, s in zip(global_size, local_size)) + pad, local_size + pad


class CUDALaunch(PreparedLaunch):
    """A launch bound once: grid, block and the argument format (`Function.prepare`) fixed,
    the arguments held as the driver takes them, so a run is one `prepared_async_call` on
    the runtime's stream. (Released PyCUDA has no CUDA graph API, so a step is this list
    of prepared launches, not a replayed graph.) `timed` records an event pair around each
    run."""

    def __init__(self, runtime, kernel, global_size, local_size, args, timed):
        self.runtime = runtime
        self.name = kernel.name
        global_size, local_size = check_launch(
            global_size, local_size, [a for a in args if a is not None])
        self.grid, self.block = grid_and_block(global_size, local_size)
        self.function = kernel.handle
        # Pointers are "P"; scalars keep their NumPy type. An argument given later is a buffer.
        self.function.prepare(["P" if a is None or isinstance(a, DeviceBuffer) else a.dtype
                               for a in args])
        self.args = [None] * len(args)
        for index, arg in enumerate(args):
            if arg is not None:
                self.set_arg(index, arg)
        self.events = (runtime._drv.Event(), runtime._drv.Event()) if timed else None
        self.ran = False

    def set_arg(self, index, arg):
        check_kernel_argument(index, arg)
        self.args[index] = int(arg.handle) if isinstance(arg, DeviceBuffer) else arg

    def run(self):
        stream = self.runtime._stream
        if self.events:
            self.events[0].record(stream)
        self.function.prepared_async_call(self.grid, self.block, stream, *self.args)
        if self.events:
            self.events[1].record(stream)
        self.ran = True

    def seconds(self):
        if not (self.events and self.ran):
            return None
        self.events[1].synchronize()
        return self.events[1].time_since(self.events[0]) * 1e-3


def release_context(context, stream):
    stream.synchronize()
    # detach pops the context if it is current and destroys it once unreferenced.
    context.detach()
