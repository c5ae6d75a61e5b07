"""The NaN finder: `make_transformer(..., debug_nans=True)` checks every op's output right
after it is computed and raises NonFiniteError at the first NaN or infinity, naming the op,
the line that built it and the ranges of its inputs.

Both transformers run one kernel (or statement) per op in this mode (fusion off), so every
op's output exists to be checked; the check runs before the call's assignments land, so
the variables keep the values that led to the failure.
"""
import numpy as np

from ngnn.origin import describe_site


class NonFiniteError(FloatingPointError):
    """An op produced NaN or Inf while the NaN finder was on."""


def check_finite(op, value, inputs):
    """Raises NonFiniteError if the float array `value`, op's output, has NaN or Inf;
    `inputs` are the values of op's arguments."""
    value = np.asarray(value)
    if value.dtype.kind != "f" or np.isfinite(value).all():
        return
    raise NonFiniteError(report(op, value, inputs))


def report(op, value, inputs):
    nan = int(np.isnan(value).sum())
    inf = int(np.isinf(value).sum())
    first = np.unravel_index(int(np.argmax(~np.isfinite(value).ravel())), value.shape) \
        if value.ndim else ()
    lines = [f"debug_nans: {op.op_name} {op} is the first op to produce a non-finite value: "
             f"{nan} NaN and {inf} Inf of its {value.size} values (first at index "
             f"{tuple(int(i) for i in first)})"]
    site = describe_site(op.origin)
    if site:
        lines.append(f"  built at {site}")
    for arg, x in zip(op.args, inputs):
        lines.append(f"  input {arg}: {value_range(np.asarray(x))}")
    return "\n".join(lines)


def value_range(x):
    if x.size == 0:
        return "empty"
    if x.dtype.kind not in "biuf":
        return f"dtype {x.dtype}"
    finite = x[np.isfinite(x)] if x.dtype.kind == "f" else x
    text = f"range [{finite.min():.6g}, {finite.max():.6g}]" if finite.size else "no finite values"
    bad = x.size - finite.size
    return text + (f", {bad} NaN/Inf" if bad else "")
