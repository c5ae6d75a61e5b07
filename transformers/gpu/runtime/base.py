"""The interface every GPU runtime implements, and the pieces the runtimes share."""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np


class DeviceMemoryError(MemoryError):
    """A computation or a buffer needs more device memory than the device has, allows at
    once, or can give."""


def check_allocation_size(runtime, what, nbytes):
    """Raises DeviceMemoryError, naming `what`, its bytes and the limit, when one allocation
    of `nbytes` exceeds the device's largest single allocation or its memory."""
    total, largest = runtime.memory_limits()
    for limit, which in ((largest, "the largest single allocation the device {} allows"),
                         (total, "the memory of the device {}")):
        if nbytes > limit:
            raise DeviceMemoryError(
                f"{what} needs {nbytes} bytes ({nbytes / 2**30:.2f} GiB), more than "
                f"{which.format(repr(runtime.device_name))} ({limit} bytes, "
                f"{limit / 2**30:.2f} GiB)")


@dataclass(eq=False)
class DeviceBuffer:
    """A device allocation of `nbytes` bytes; `handle` is the runtime's native object
    (a pyopencl.Buffer or a pycuda DeviceAllocation)."""
    nbytes: int
    handle: Any


@dataclass(eq=False)
class Kernel:
    """A compiled kernel entry point; `handle` is a pyopencl.Kernel or a pycuda Function."""
    name: str
    handle: Any


def numbered_source(source):
    """The source with line numbers, so compiler messages that cite lines can be followed."""
    lines = source.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, 1))


class Runtime(ABC):
    """A device, its memory and its kernels.

    `name` and `dialect` are "cuda" or "opencl": the dialect selects how templates/prelude.j2 renders.
    Copies are blocking; launches are queued in order and `synchronize` waits for them.
    `transferred` counts the bytes `write` sent to the device and `read` brought back, since
    the runtime was created (a computation's `transfer_bytes` is the difference over a call).
    """
    name: str
    dialect: str
    device_name: str
    transferred: dict

    def count_transfer(self, direction, nbytes):
        """Adds a host-device copy of `nbytes` to `transferred` ("to_device", "from_device")."""
        self.transferred[direction] += int(nbytes)

    @abstractmethod
    def alloc(self, nbytes, what="a buffer") -> DeviceBuffer:
        """A new buffer of `nbytes` bytes (zero is allowed), contents undefined. A request the
        device cannot meet raises DeviceMemoryError naming `what`: checked against the
        device's limits before the driver is asked (`checked_size`), and a driver's own
        out-of-memory answer turned into the same error."""

    def checked_size(self, nbytes, what):
        """`nbytes` as an int, once it is known to fit the device's limits."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes for {what}")
        check_allocation_size(self, what, nbytes)
        return nbytes

    @abstractmethod
    def free(self, buffer):
        """Release `buffer` now (a closed transformer's memory), not when it is collected."""

    @abstractmethod
    def memory_limits(self):
        """(bytes of device memory, bytes of the largest single allocation)."""

    @abstractmethod
    def write(self, buffer, offset_bytes, host_array):
        """Copy the whole contiguous `host_array` into `buffer` starting at `offset_bytes`."""

    @abstractmethod
    def read(self, buffer, offset_bytes, host_out_array):
        """Fill the contiguous writable `host_out_array` from `buffer` starting at `offset_bytes`."""

    @abstractmethod
    def copy(self, dst, dst_offset, src, src_offset, nbytes):
        """Copy `nbytes` bytes between device buffers, after the launches queued before it."""

    @abstractmethod
    def fill_zero(self, buffer):
        """Set every byte of `buffer` to zero."""

    @abstractmethod
    def build(self, source, kernel_names) -> dict:
        """Compile `source` (prelude included) and return {name: Kernel} for `kernel_names`."""

    @abstractmethod
    def launch(self, kernel, global_size, local_size, args):
        """Run `kernel` on `global_size` work-items per dimension in groups of `local_size`.

        `args` are DeviceBuffers or NumPy scalars (np.int32, np.uint32, np.uint64, np.float32)
        in the order of the kernel's parameters.
        """

    @abstractmethod
    def prepare(self, kernel, global_size, local_size, args, timed=False):
        """A launch of `kernel` bound once (a `PreparedLaunch`): geometry checked and arguments
        converted now, so running it again costs one enqueue. An argument may be None, to be
        given with `set_arg` before the first `run`. `timed` asks for each run's device time
        where that costs extra (CUDA events); OpenCL's profiling events time every run."""

    @abstractmethod
    def synchronize(self):
        """Wait until every queued launch has finished."""

    @abstractmethod
    def close(self):
        """Release the device context; the runtime is unusable afterwards."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} on {self.device_name!r}>"


def check_copy(buffer, offset_bytes, host_array, writable):
    """Validate a copy between `buffer` and `host_array` before handing it to a driver, which
    would otherwise corrupt memory or fail with an opaque status code."""
    if not isinstance(buffer, DeviceBuffer):
        raise TypeError(f"expected a DeviceBuffer, got {type(buffer).__name__}")
    if not isinstance(host_array, np.ndarray):
        raise TypeError(f"expected a numpy array, got {type(host_array).__name__}")
    if not host_array.flags.c_contiguous:
        raise ValueError("host array must be C-contiguous (use np.ascontiguousarray)")
    if writable and not host_array.flags.writeable:
        raise ValueError("host output array is read-only")
    if offset_bytes < 0 or offset_bytes + host_array.nbytes > buffer.nbytes:
        raise ValueError(f"copy of {host_array.nbytes} bytes at offset {offset_bytes} does not fit "
                         f"in a buffer of {buffer.nbytes} bytes")


class PreparedLaunch(ABC):
    """One kernel launch with its geometry and arguments bound (Runtime.prepare)."""

    @abstractmethod
    def set_arg(self, index, arg):
        """Rebinds argument `index` (a DeviceBuffer or a NumPy scalar) for later runs."""

    @abstractmethod
    def run(self):
        """Queues the launch."""

    @abstractmethod
    def seconds(self):
        """Device seconds of the last run (waiting for it), or None where not timed."""


def check_launch(global_size, local_size, args):
    """Validate launch geometry and arguments; returns (global_size, local_size) as int tuples."""
    global_size = tuple(int(g) for g in global_size)
    local_size = tuple(int(s) for s in local_size)
    if not 1 <= len(global_size) <= 3 or len(global_size) != len(local_size):
        raise ValueError(f"global_size {global_size} and local_size {local_size} must have the "
                         f"same number (1 to 3) of dimensions")
    for g, s in zip(global_size, local_size):
        if s <= 0 or g <= 0 or g % s:
            raise ValueError(f"global_size {global_size} must be a positive multiple of "
                             f"local_size {local_size} in every dimension")
    for i, arg in enumerate(args):
        check_kernel_argument(i, arg)
    return global_size, local_size


def check_kernel_argument(index, arg):
    if not isinstance(arg, (DeviceBuffer, np.int32, np.uint32, np.uint64, np.float32)):
        raise TypeError(f"kernel argument {index} is {type(arg).__name__}; expected a "
                        f"DeviceBuffer or np.int32 / np.uint32 / np.uint64 / np.float32")


def check_device_copy(dst, dst_offset, src, src_offset, nbytes):
    for buffer, offset in ((dst, dst_offset), (src, src_offset)):
        if not isinstance(buffer, DeviceBuffer):
            raise TypeError(f"expected a DeviceBuffer, got {type(buffer).__name__}")
        if offset < 0 or nbytes < 0 or offset + nbytes > buffer.nbytes:
            raise ValueError(f"copy of {nbytes} bytes at offset {offset} does not fit in a "
                             f"buffer of {buffer.nbytes} bytes")
