"""On-disk cache of compiled kernel binaries.

Compiling kernels (nvcc, or an OpenCL driver such as PoCL) takes from a fraction of a second to
several seconds per program, and the same programs are rebuilt on every run of a model or the
tests. Entries are keyed by everything that affects the binary, so a stale entry can never be
returned; a new driver or compiler simply produces new keys.
"""
import hashlib
import os
import tempfile
import warnings
from pathlib import Path


def default_cache_dir():
    """`NGNN_CACHE_DIR` if set, else ~/.cache/ngnn."""
    configured = os.environ.get("NGNN_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "ngnn"


class CompileCache:
    """Maps a key (see `key`) to binary bytes, one file per entry in `directory`.

    `hits` and `misses` count lookups so callers and tests can see whether a build compiled.
    """

    def __init__(self, directory=None):
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self._warned = False

    @staticmethod
    def key(*parts):
        """sha256 over the parts; each part is length-prefixed so ("ab", "c") != ("a", "bc")."""
        digest = hashlib.sha256()
        for part in parts:
            data = part if isinstance(part, bytes) else str(part).encode()
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
        return digest.hexdigest()

    def _path(self, key):
        return self.directory / f"{key}.bin"

    def get(self, key):
        """The cached bytes for `key`, or None."""
        try:
            data = self._path(key).read_bytes()
        except OSError:
            self.misses += 1
            return None
        self.hits += 1
        return data

    def put(self, key, data):
        """Store `data` atomically: readers (other processes included) see the whole entry or none."""
        tmp_name = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # The temporary file lives in the cache directory so os.replace is a same-filesystem rename.
            with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".tmp-", delete=False) as tmp:
                tmp_name = tmp.name
                tmp.write(data)
            os.replace(tmp_name, self._path(key))
        except OSError as err:
            if tmp_name is not None and os.path.exists(tmp_name):
                os.unlink(tmp_name)
            # A read-only or full cache directory costs speed, not correctness: keep going.
            if not self._warned:
                warnings.warn(f"ngnn compile cache disabled, cannot write {self.directory}: {err}")
                self._warned = True
