"""Arrays from other libraries (PyTorch tensors, DGL's and PyG's containers) as NumPy.

ngnn never imports those libraries: it reads what their objects expose. A torch tensor is
detached and moved to the CPU through its own methods, then read with `.numpy()`; anything
else goes through NumPy's `__array__` protocol.
"""
import numpy as np


def to_numpy(value, name):
    """`value` (a NumPy array, a torch tensor, or anything with `__array__`) as NumPy."""
    if isinstance(value, np.ndarray):
        return value
    if value is None:
        raise ValueError(f"{name} is missing (None)")
    try:
        if callable(getattr(value, "numpy", None)):
            for method in ("detach", "cpu"):     # torch: leave the autograd graph and the GPU
                if callable(getattr(value, method, None)):
                    value = getattr(value, method)()
            return np.asarray(value.numpy())
        if hasattr(value, "__array__") or isinstance(value, (list, tuple)):
            return np.asarray(value)
    except (TypeError, RuntimeError, ValueError) as err:
        raise ValueError(f"{name}: cannot read it as a NumPy array ({err})") from err
    raise ValueError(f"{name} must be an array (NumPy, a torch tensor or anything with "
                     f"__array__), got {type(value).__name__}")


def to_mask(value, name):
    """A boolean mask; integer 0/1 masks (older DGL and PyG data) become booleans."""
    mask = to_numpy(value, name)
    if mask.dtype.kind in "iu" and np.isin(mask, (0, 1)).all():
        return mask.astype(bool)
    return mask
