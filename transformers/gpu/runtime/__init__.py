"""Device runtimes for the GPU transformer: memory, kernel builds and launches.

`get_runtime()` picks CUDA (PyCUDA) when an NVIDIA device is present, else OpenCL (PyOpenCL);
both build kernels rendered from the same templates, with templates/prelude.j2 making the CUDA-first
kernel text valid in the runtime's dialect.
"""
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2

from .base import DeviceBuffer, DeviceMemoryError, Kernel, Runtime, numbered_source
from .cache import CompileCache, default_cache_dir
from .nvcc import compile_ptx, nvcc_available

__all__ = ["DeviceBuffer", "DeviceMemoryError", "Kernel", "Runtime", "CompileCache",
           "default_cache_dir", "compile_ptx", "nvcc_available", "numbered_source",
           "get_runtime", "available_runtimes", "runtime_unavailable_reason",
           "template_environment", "render_prelude", "DIALECTS"]

DIALECTS = ("cuda", "opencl")
RUNTIME_ORDER = ("cuda", "opencl")

INSTALL_HELP = {
    "cuda": "the CUDA runtime needs an NVIDIA GPU with its driver and `pip install ngnn[cuda]` (PyCUDA)",
    "opencl": "the OpenCL runtime needs `pip install ngnn[opencl]` (PyOpenCL) and an OpenCL driver "
              "(ICD), for example Debian's `apt-get install pocl-opencl-icd` for CPUs",
}


def _templates_dir():
    try:
        path = resources.files("ngnn.templates")
        if path.joinpath("prelude.j2").is_file():
            return Path(str(path))
    except ModuleNotFoundError:
        pass
    # Running from a source checkout that is not installed: templates/ sits at the repo root.
    return Path(__file__).resolve().parents[3] / "templates"


@lru_cache(maxsize=None)
def template_environment():
    """The Jinja environment for kernel templates; templates may `{% include "prelude.j2" %}`."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(_templates_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def render_prelude(dialect, fp64=False):
    """The macro prelude for `dialect` ("cuda" or "opencl"), to put before kernel text;
    `fp64` enables double precision where the dialect needs it declared (OpenCL)."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown kernel dialect {dialect!r}; expected one of {DIALECTS}")
    return template_environment().get_template("prelude.j2").render(dialect=dialect, fp64=fp64)


def _probe_cuda():
    try:
        import pycuda.driver as drv
    except ImportError:
        return "PyCUDA is not installed"
    try:
        drv.init()
        count = drv.Device.count()
    except drv.Error as err:
        return f"the CUDA driver failed to initialise ({err})"
    return None if count else "the CUDA driver reports no devices"


def _probe_opencl():
    try:
        import pyopencl as cl
    except ImportError:
        return "PyOpenCL is not installed"
    try:
        devices = [dev for platform in cl.get_platforms() for dev in platform.get_devices()]
    except cl.Error as err:
        return f"no OpenCL platform could be listed ({err})"
    return None if devices else "no OpenCL devices were found"


_PROBES = {"cuda": _probe_cuda, "opencl": _probe_opencl}


@lru_cache(maxsize=None)
def runtime_unavailable_reason(name):
    """None if runtime `name` works on this machine, else why not. Probed once per process:
    initialising drivers is slow and their answer does not change while we run."""
    if name not in _PROBES:
        raise ValueError(f"unknown GPU runtime {name!r}; expected one of {RUNTIME_ORDER}")
    return _PROBES[name]()


def available_runtimes():
    """Names of the runtimes that work here, preferred first."""
    return [name for name in RUNTIME_ORDER if runtime_unavailable_reason(name) is None]


def get_runtime(name=None, **kwargs):
    """A new runtime: `name` "cuda" or "opencl" forces one; None picks the first that works.

    Keyword arguments go to the runtime's constructor (for example `cache=CompileCache(dir)`).
    """
    if name is None:
        available = available_runtimes()
        if not available:
            reasons = "; ".join(f"{n}: {runtime_unavailable_reason(n)}" for n in RUNTIME_ORDER)
            raise RuntimeError(f"no GPU runtime is available ({reasons}). To fix: "
                               f"{INSTALL_HELP['opencl']}; or {INSTALL_HELP['cuda']}.")
        name = available[0]
    reason = runtime_unavailable_reason(name)
    if reason is not None:
        raise RuntimeError(f"the {name} GPU runtime is unavailable: {reason}. "
                           f"To fix: {INSTALL_HELP[name]}.")
    if name == "cuda":
        from .cuda import CUDARuntime
        return CUDARuntime(**kwargs)
    from .opencl import OpenCLRuntime
    return OpenCLRuntime(**kwargs)
