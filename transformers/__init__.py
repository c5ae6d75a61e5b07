"""Transformers: turn computations into code for a device (imported as ngnn.transformers).

    t = make_transformer("numpy")      # or "gpu"; transformer_choices() lists what runs here
"""
import difflib

from ngnn.out_of_core import ChunkedProgram

from .base import Computation, DeviceBufferStorage, DeviceTensor, Transformer

# Chunked execution (ngnn.out_of_core) is built on the base transformer and plugs in here.
Computation.chunked_program = ChunkedProgram


def _numpy():
    from .numpy import NumPyTransformer
    return NumPyTransformer


def _gpu():
    from .gpu import GPUTransformer
    return GPUTransformer


_FACTORIES = {"numpy": _numpy, "gpu": _gpu}


def transformer_choices():
    """Names of the transformers that can run on this machine."""
    names = ["numpy"]
    try:
        from .gpu.runtime import available_runtimes
        if available_runtimes():
            names.append("gpu")
    except ImportError:
        pass
    return names


def make_transformer(name="numpy", **options):
    """A new transformer by name, e.g. make_transformer("gpu", runtime="opencl")."""
    if name not in _FACTORIES:
        close = difflib.get_close_matches(str(name).lower(), list(_FACTORIES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown transformer {name!r}{hint}; choose from {sorted(_FACTORIES)}")
    return _FACTORIES[name]()(**options)


__all__ = ["Computation", "DeviceBufferStorage", "DeviceTensor", "Transformer",
           "make_transformer", "transformer_choices"]
