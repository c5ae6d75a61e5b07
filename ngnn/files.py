"""Writing files atomically: a crash or an error mid-write leaves any old file intact."""
import os
import tempfile


def write_atomically(path, data):
    """Writes the bytes `data` to `path` through a temporary file in the same folder."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path
