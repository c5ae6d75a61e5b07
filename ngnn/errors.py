"""Errors that point at the user's line, not at ngnn's internals. This module sits below
the op-graph and the front end, so ops can raise them without importing upward."""
import os
import traceback

import numpy as np

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames of these are not the user's: ngnn's own, and NumPy's when np.sum(x) reached x.
_NOT_USER = (_PACKAGE_DIR + os.sep, os.path.dirname(os.path.abspath(np.__file__)) + os.sep)


def user_frame():
    """(file, line, source) of the innermost stack frame outside the ngnn package."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_NOT_USER) and "multipledispatch" not in path:
            return frame.filename, frame.lineno, (frame.line or "").strip()
    return "<unknown>", 0, ""


def at_user_line(message):
    filename, lineno, line = user_frame()
    where = f'File "{filename}", line {lineno}'
    return f"{message}\n  at {where}: {line}" if line else f"{message}\n  at {where}"


class TracingError(ValueError):
    """Python in a traced region that ngnn cannot turn into ops."""


def control_flow_error(op):
    return TracingError(at_user_line(
        f"data-dependent control flow is not supported: Python `if`, `while`, `and`/`or` or "
        f"bool() on the symbolic tensor {op!r} would need its value, which exists only when "
        "the computation runs. Use ng.maximum / ng.minimum or masks (ng.cast(x > y, ...))."))
