"""Where an op was made: the innermost stack frame outside ngnn's compiler core, recorded
when the op is built, so an error about the op at run time (the NaN finder's) can point at
the line that made it: the user's own line, or the line of an ngnn.nn layer, loss or
optimizer that built it for them."""
import contextlib
import linecache
import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))
_CORE = tuple(os.path.join(_ROOT, part) for part in
              ("op_graph", "frontend", "passes", "autodiff.py", "ops.py", "dispatch.py",
               "graph.py", "transformers")) + \
    (os.path.join(os.path.dirname(_ROOT), "transformers"),)   # a source checkout's layout


_given = []    # origins that ops built now take instead (innermost last)


@contextlib.contextmanager
def built_for(origin):
    """Ops built inside take `origin`: the compiler's rewrites (lowering, passes) make ops
    on behalf of ops the user built, and None lets a replacement take the origin of the
    op it replaces (Op.forward)."""
    _given.append(origin)
    try:
        yield
    finally:
        _given.pop()


def creation_site():
    """(file, line) of the innermost caller outside the core, or None."""
    if _given:
        return _given[-1]
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_CORE) and "multipledispatch" not in path:
            return path, frame.f_lineno
        frame = frame.f_back
    return None


def describe_site(site):
    """'File "...", line N: source' for a creation site ('' when unknown)."""
    if site is None:
        return ""
    filename, lineno = site
    line = linecache.getline(filename, lineno).strip()
    return f'File "{filename}", line {lineno}' + (f": {line}" if line else "")
