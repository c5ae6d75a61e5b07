"""Compile CUDA renderings of kernels to PTX with nvcc, without a GPU.

The tests use this to prove that every kernel's CUDA text compiles even on machines that run the
kernels through OpenCL. nvcc's start-up dominates small compiles, so all sources that are not in
the cache go through a single nvcc invocation (nvcc accepts several inputs with -ptx).
"""
import re
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from .base import numbered_source
from .cache import CompileCache


def nvcc_available():
    return shutil.which("nvcc") is not None


@lru_cache(maxsize=None)
def _nvcc_version():
    return subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout


def compile_ptx(sources, arch="sm_80", options=(), cache=None):
    """PTX text for each CUDA source: {name: source} -> {name: ptx}.

    Raises RuntimeError with nvcc's messages and the numbered text of each failing source.
    """
    if not nvcc_available():
        raise RuntimeError("nvcc was not found on PATH; install the CUDA toolkit to compile "
                           "CUDA kernels")
    cache = cache if cache is not None else CompileCache()
    options = [f"-arch={arch}", *options]
    keys = {name: cache.key("nvcc-ptx", _nvcc_version(), " ".join(options), src)
            for name, src in sources.items()}
    ptx = {}
    missing = []
    for name, key in keys.items():
        data = cache.get(key)
        if data is None:
            missing.append(name)
        else:
            ptx[name] = data.decode()
    if missing:
        with tempfile.TemporaryDirectory(prefix="ngnn-nvcc-") as tmp:
            tmp = Path(tmp)
            # Kernel names need not be valid file names, so files are numbered instead.
            files = {f"k{i}.cu": name for i, name in enumerate(missing)}
            for file, name in files.items():
                (tmp / file).write_text(sources[name])
            proc = subprocess.run(["nvcc", "-ptx", *options, *files, "--output-directory", "."],
                                  cwd=tmp, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(_failure_message(proc.stdout + proc.stderr, files, sources))
            for file, name in files.items():
                text = (tmp / file).with_suffix(".ptx").read_text()
                cache.put(keys[name], text.encode())
                ptx[name] = text
    return {name: ptx[name] for name in sources}


def _failure_message(output, files, sources):
    # nvcc prefixes each diagnostic with the input file name: show the sources it complains about.
    failing = [name for file, name in files.items() if re.search(rf"\b{re.escape(file)}\b", output)]
    shown = failing or list(files.values())
    renamed = output
    for file, name in files.items():
        renamed = re.sub(rf"\b{re.escape(file)}\b", f"<{name}>", renamed)
    parts = [f"nvcc failed for {', '.join(shown)}:", renamed.strip()]
    for name in shown:
        parts.append(f"--- source of {name} ---\n{numbered_source(sources[name])}")
    return "\n".join(parts)
