"""The NumPy transformer: generated Python modules of NumPy and SciPy calls."""
from .codegen import NumPyCodeGenerator
from .transformer import NumPyDeviceBufferStorage, NumPyDeviceTensor, NumPyTransformer

__all__ = ["NumPyCodeGenerator", "NumPyDeviceBufferStorage", "NumPyDeviceTensor",
           "NumPyTransformer"]
