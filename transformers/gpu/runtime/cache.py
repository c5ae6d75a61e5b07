"""On-disk cache of compiled kernel binaries.

Compiling kernels (nvcc, or an OpenCL driver such as PoCL) takes from a fraction of a second to
several seconds per program, and the same programs are rebuilt on every run of a model or the
tests. Entries are keyed by everything that affects the binary, so a stale entry can never be
returned; a new driver or compiler simply produces new keys.

Each entry file holds a header (magic, length, sha256 of the bytes) before the bytes: an entry
cut short or damaged on disk is detected before its bytes reach a driver (which may crash on
them), deleted, and rebuilt by the caller. Temporary files left by a writer that died are
removed once they are older than STALE_SECONDS.
"""
import hashlib
import os
import tempfile
import time
import warnings
from pathlib import Path

MAGIC = b"NGNNBIN1"
HEADER_BYTES = len(MAGIC) + 8 + 32
STALE_SECONDS = 3600


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
        self.corrupt = 0
        self._warned = False
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self):
        try:
            leftovers = list(self.directory.glob(".tmp-*"))
        except OSError:
            return
        now = time.time()
        for path in leftovers:
            try:
                if now - path.stat().st_mtime > STALE_SECONDS:
                    path.unlink()
            except OSError:
                pass       # another process removed or replaced it first

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
        path = self._path(key)
        try:
            entry = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        data = unpack(entry)
        if data is None:
            self.corrupt += 1
            self.misses += 1
            try:
                path.unlink()
            except OSError:
                pass
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
                tmp.write(pack(data))
            os.replace(tmp_name, self._path(key))
        except OSError as err:
            if tmp_name is not None and os.path.exists(tmp_name):
                os.unlink(tmp_name)
            # A read-only or full cache directory costs speed, not correctness: keep going.
            if not self._warned:
                warnings.warn(f"ngnn compile cache disabled, cannot write {self.directory}: {err}")
                self._warned = True


def pack(data):
    data = bytes(data)
    return MAGIC + len(data).to_bytes(8, "little") + hashlib.sha256(data).digest() + data


def unpack(entry):
    """The bytes of a whole, undamaged entry, else None."""
    if len(entry) < HEADER_BYTES or not entry.startswith(MAGIC):
        return None
    length = int.from_bytes(entry[len(MAGIC):len(MAGIC) + 8], "little")
    digest = entry[len(MAGIC) + 8:HEADER_BYTES]
    data = entry[HEADER_BYTES:]
    if len(data) != length or hashlib.sha256(data).digest() != digest:
        return None
    return data
