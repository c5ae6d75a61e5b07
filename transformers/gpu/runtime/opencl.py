"""OpenCL runtime through PyOpenCL: any OpenCL 1.2 device, including PoCL on a CPU."""
import numpy as np

from .base import (DeviceBuffer, DeviceMemoryError, Kernel, PreparedLaunch, Runtime,
                   check_copy, check_device_copy, check_kernel_argument, check_launch,
                   numbered_source)
from .cache import CompileCache

BUILD_OPTIONS = ("-cl-std=CL1.2",)


def _all_devices(cl):
    return [dev for platform in cl.get_platforms() for dev in platform.get_devices()]


def pick_device(cl):
    """A GPU if there is one (it is what OpenCL is for), else the first device of any type."""
    devices = _all_devices(cl)
    if not devices:
        raise RuntimeError("OpenCL found no devices; install an ICD such as Debian's pocl-opencl-icd")
    gpus = [dev for dev in devices if dev.type & cl.device_type.GPU]
    return (gpus or devices)[0]


class OpenCLRuntime(Runtime):
    name = "opencl"
    dialect = "opencl"

    def __init__(self, device=None, cache=None):
        import pyopencl as cl
        self._cl = cl
        self._device = device if device is not None else pick_device(cl)
        self.device_name = self._device.name.strip()
        self._context = cl.Context([self._device])
        # In-order queue: launches and copies run in submission order, as the transformer assumes.
        # Profiling on: every launch's event then carries its device time, read only when a
        # kernel report asks (no measurable cost on PoCL; docs/gpu_runtime.md).
        self._queue = cl.CommandQueue(self._context, self._device,
                                      properties=cl.command_queue_properties.PROFILING_ENABLE)
        # A CPU device's buffers are host memory. PoCL allocates a buffer's memory when it
        # first uses it, and aborts the process (an assertion in
        # pocl_create_migration_commands) when that allocation fails; ALLOC_HOST_PTR makes
        # it allocate in clCreateBuffer, which reports the failure as an error instead.
        self._alloc_flags = cl.mem_flags.READ_WRITE | (
            cl.mem_flags.ALLOC_HOST_PTR if self._device.type & cl.device_type.CPU else 0)
        self.cache = cache if cache is not None else CompileCache()
        self.transferred = {"to_device": 0, "from_device": 0}

    def alloc(self, nbytes, what="a buffer"):
        nbytes = self.checked_size(nbytes, what)
        try:
            # OpenCL rejects zero-sized buffers; empty tensors still need a handle to pass
            # to kernels.
            handle = self._cl.Buffer(self._context, self._alloc_flags, size=max(1, nbytes))
        except self._cl.Error as err:
            if err.code not in (self._cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
                                self._cl.status_code.OUT_OF_HOST_MEMORY,
                                self._cl.status_code.OUT_OF_RESOURCES):
                raise
            raise DeviceMemoryError(
                f"{what} needs {nbytes} bytes ({nbytes / 2**30:.2f} GiB), which the device "
                f"{self.device_name!r} could not allocate ({err}): within its limits, "
                f"but more than the memory left") from None
        return DeviceBuffer(nbytes, handle)

    def free(self, buffer):
        if buffer.handle is not None:
            buffer.handle.release()
            buffer.handle = None

    def memory_limits(self):
        return int(self._device.global_mem_size), int(self._device.max_mem_alloc_size)

    def write(self, buffer, offset_bytes, host_array):
        check_copy(buffer, offset_bytes, host_array, writable=False)
        if host_array.nbytes:
            self._cl.enqueue_copy(self._queue, buffer.handle, host_array,
                                  dst_offset=offset_bytes, is_blocking=True)
            self.count_transfer("to_device", host_array.nbytes)

    def read(self, buffer, offset_bytes, host_out_array):
        check_copy(buffer, offset_bytes, host_out_array, writable=True)
        if host_out_array.nbytes:
            self._cl.enqueue_copy(self._queue, host_out_array, buffer.handle,
                                  src_offset=offset_bytes, is_blocking=True)
            self.count_transfer("from_device", host_out_array.nbytes)

    def copy(self, dst, dst_offset, src, src_offset, nbytes):
        check_device_copy(dst, dst_offset, src, src_offset, nbytes)
        if nbytes:
            self._cl.enqueue_copy(self._queue, dst.handle, src.handle, byte_count=nbytes,
                                  src_offset=src_offset, dst_offset=dst_offset)

    def fill_zero(self, buffer):
        self._cl.enqueue_fill_buffer(self._queue, buffer.handle, np.uint8(0), 0,
                                     max(1, buffer.nbytes)).wait()

    def _cache_key(self, source, options):
        dev = self._device
        return self.cache.key("opencl", dev.platform.name, dev.platform.version, dev.name,
                              dev.driver_version, " ".join(options), source)

    def build(self, source, kernel_names, options=BUILD_OPTIONS):
        cl = self._cl
        options = list(options)
        key = self._cache_key(source, options)
        binary = self.cache.get(key)
        program = None
        if binary is not None:
            try:
                program = cl.Program(self._context, [self._device], [binary]).build(options=options)
            except cl.Error:
                # A binary the driver no longer accepts is rebuilt from source and replaced below.
                program = None
        if program is None:
            try:
                # cache_dir=False: PyOpenCL's own cache would duplicate ours.
                program = cl.Program(self._context, source).build(options=options, cache_dir=False)
            except cl.Error as err:
                raise RuntimeError(f"OpenCL build failed on {self.device_name}:\n{err}\n"
                                   f"--- source ---\n{numbered_source(source)}") from None
            self.cache.put(key, program.get_info(cl.program_info.BINARIES)[0])
        kernels = {}
        for name in kernel_names:
            try:
                kernels[name] = Kernel(name, cl.Kernel(program, name))
            except cl.Error:
                raise RuntimeError(f"kernel {name!r} is not defined in the built source") from None
        return kernels

    def launch(self, kernel, global_size, local_size, args):
        global_size, local_size = check_launch(global_size, local_size, args)
        native = [a.handle if isinstance(a, DeviceBuffer) else a for a in args]
        kernel.handle.set_args(*native)
        self._cl.enqueue_nd_range_kernel(self._queue, kernel.handle, global_size, local_size)

    def prepare(self, kernel, global_size, local_size, args, timed=False):
        return OpenCLLaunch(self, kernel, global_size, local_size, args)

    def synchronize(self):
        self._queue.finish()

    def close(self):
        if self._queue is not None:
            self._queue.finish()
            self._queue = None
            self._context = None


class OpenCLLaunch(PreparedLaunch):
    """A launch bound once. It owns a kernel object of its own: OpenCL keeps arguments in the
    kernel object, and built programs are shared between computations, so each launch sets
    its arguments once instead of before every enqueue."""

    def __init__(self, runtime, kernel, global_size, local_size, args):
        self.runtime = runtime
        self.name = kernel.name
        self.global_size, self.local_size = check_launch(
            global_size, local_size, [a for a in args if a is not None])
        self.handle = runtime._cl.Kernel(kernel.handle.program, kernel.name)
        self.event = None
        for index, arg in enumerate(args):
            if arg is not None:
                self.set_arg(index, arg)

    def set_arg(self, index, arg):
        check_kernel_argument(index, arg)
        self.handle.set_arg(index, arg.handle if isinstance(arg, DeviceBuffer) else arg)

    def run(self):
        self.event = self.runtime._cl.enqueue_nd_range_kernel(
            self.runtime._queue, self.handle, self.global_size, self.local_size)

    def seconds(self):
        if self.event is None:
            return None
        self.event.wait()
        return (self.event.profile.end - self.event.profile.start) * 1e-9
