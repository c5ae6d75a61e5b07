"""A fake `pycuda` (driver and compiler), so the CUDA runtime and the GPU transformer's
CUDA path run where no NVIDIA GPU is: every call is recorded, device memory is a
bytearray, kernels do nothing."""
import sys
import types

import numpy as np


class FakeCuda:
    """Just enough of pycuda.driver and pycuda.compiler for CUDARuntime, recording each call;
    device memory is a bytearray addressed by integer pointers as in CUDA."""

    class Error(Exception):
        pass

    class CompileError(Error):
        pass

    class LogicError(Error):
        pass

    def __init__(self):
        self.calls = []
        self.memory = bytearray()
        fake = self

        class Device:
            @staticmethod
            def count():
                return 1

            def __init__(self, index):
                self.index = index

            def name(self):
                return "Fake GPU"

            def compute_capability(self):
                return (8, 6)

            def total_memory(self):
                return 80 << 30

            def retain_primary_context(self):
                fake.calls.append(("retain_primary_context",))
                return Context()

        class Context:
            def push(self):
                fake.calls.append(("push",))

            def detach(self):
                fake.calls.append(("detach",))

        class Stream:
            def synchronize(self):
                pass

        class Module:
            def __init__(self, cubin):
                self.source = cubin.decode()

            def get_function(self, name):
                if f" {name}(" not in self.source:
                    raise fake.LogicError(name)
                return Function(name)

        class Function:
            def __init__(self, name):
                self.name = name

            def __call__(self, *args, block, grid, stream):
                fake.calls.append(("launch", args, block, grid))

            def prepare(self, arg_types):
                self.arg_types = list(arg_types)
                return self

            def prepared_async_call(self, grid, block, stream, *args):
                assert len(args) == len(self.arg_types) and None not in args
                fake.calls.append(("prepared", self.name, args, block, grid))

        class Event:
            def record(self, stream):
                fake.calls.append(("event",))

            def synchronize(self):
                pass

            def time_since(self, start):
                return 0.5          # milliseconds

        self.Device, self.Stream, self.Event = Device, Stream, Event
        self.module_from_buffer = lambda cubin: (self.calls.append(("module", cubin)),
                                                 Module(cubin))[1]

    def init(self):
        self.calls.append(("init",))

    def mem_alloc(self, nbytes):
        fake = self

        class Pointer(int):       # pycuda's DeviceAllocation converts to its address
            def free(self):
                fake.calls.append(("free", int(self)))

        pointer = Pointer(len(self.memory) + 256)       # never 0, like a real device pointer
        self.memory.extend(bytes(nbytes + 256))
        self.calls.append(("alloc", nbytes))
        return pointer

    def memcpy_htod(self, pointer, array):
        self.memory[pointer - 256:pointer - 256 + array.nbytes] = array.tobytes()
        self.calls.append(("htod", pointer, array.nbytes))

    def memcpy_dtoh(self, array, pointer):
        array[...] = np.frombuffer(self.memory, array.dtype, array.size, pointer - 256) \
            .reshape(array.shape)
        self.calls.append(("dtoh", pointer, array.nbytes))

    def memcpy_dtod_async(self, dst, src, nbytes, stream):
        self.memory[dst - 256:dst - 256 + nbytes] = self.memory[src - 256:src - 256 + nbytes]
        self.calls.append(("dtod", dst, src, nbytes))

    def memset_d8(self, pointer, value, nbytes):
        self.memory[pointer - 256:pointer - 256 + nbytes] = bytes([value]) * nbytes

    def compile(self, source, options, no_extern_c, arch, cache_dir):
        self.calls.append(("compile", options, no_extern_c, arch, cache_dir))
        return b"cubin:" + source.encode()


def install_fake_pycuda(monkeypatch):
    """Puts a FakeCuda in place of pycuda for the test; returns it."""
    fake = FakeCuda()
    pycuda = types.ModuleType("pycuda")
    compiler = types.ModuleType("pycuda.compiler")
    compiler.compile = fake.compile
    pycuda.driver, pycuda.compiler = fake, compiler
    monkeypatch.setitem(sys.modules, "pycuda", pycuda)
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake)
    monkeypatch.setitem(sys.modules, "pycuda.compiler", compiler)
    return fake
