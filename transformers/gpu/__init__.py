"""The GPU transformer: Jinja kernel templates rendered for CUDA (PyCUDA) or OpenCL
(PyOpenCL, PoCL on CPUs), launched as a GPUKernelGroup over DeviceBufferStorage."""
from .kernels import GPUKernel, GPUKernelGenerator
from .transformer import (GPUComputation, GPUDeviceBufferStorage, GPUDeviceTensor,
                          GPUKernelGroup, GPUTransformer)

__all__ = ["GPUComputation", "GPUDeviceBufferStorage", "GPUDeviceTensor", "GPUKernel",
           "GPUKernelGenerator", "GPUKernelGroup", "GPUTransformer"]
