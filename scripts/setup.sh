#!/usr/bin/env bash
# Installs ngnn with what its tests use: the OpenCL runtime (PoCL, so the GPU transformer's
# kernels run on this CPU), pyopencl, the test tools, Graphviz and matplotlib for pictures
# and plots, and MkDocs for the documentation site (its strict build is a test). nvcc, when
# present, compiles the CUDA rendering of every kernel in the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pocl-opencl-icd ocl-icd-libopencl1 >/dev/null
    else
        echo "setup: no OpenCL driver found; install Debian's pocl-opencl-icd (or your GPU's ICD)" >&2
        exit 1
    fi
fi
if ! command -v dot >/dev/null; then
    # Graphviz's dot draws the IR (ngnn show-ir --out, comp.draw); its tests need it.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null
    else
        echo "setup: Graphviz's dot program not found; install Debian's graphviz package" >&2
        exit 1
    fi
fi
python -m pip install -q -e ".[test,opencl,viz,docs]"
