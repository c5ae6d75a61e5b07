#!/usr/bin/env bash
# Run on a machine WITHOUT the GPU (internet or a PyPI mirror, nvcc, no driver): fills
# .whl/ with what a lent NVIDIA machine (Python 3.12, no package registry) lacks to run
# ngnn's CUDA path and its MPI tests: a PyCUDA wheel built here, and wheels of its
# dependencies, mpi4py, mpich, pymetis and pyopencl. Then, there: bash scripts/gpu_setup.sh
#
# PyCUDA ships no wheels, and building it there costs minutes of GPU time. It links against
# the driver's libcuda.so.1, absent here: an empty stub with that soname takes its place
# at link time (--no-as-needed keeps the dependency recorded), and the real driver
# resolves the symbols at import there. Needs python3.12 with headers (pyenv's will do).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON312=${PYTHON312:-python3.12}
CUDA_ROOT=${CUDA_ROOT:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
[ -f "$CUDA_ROOT/include/cuda.h" ] || CUDA_ROOT=$(ls -d /usr/local/cuda-* | tail -1)
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.whl/ >> .git/info/exclude; }
mkdir -p .whl
rm -f .whl/*.whl          # one version of each package, or pip refuses the lot there
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
binary=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux_2_28_x86_64)
python3 -m pip download -q "${binary[@]}" -d .whl siphash24 mpi4py pymetis pyopencl "mpich>=4"
python3 -m pip download -q --no-deps -d .whl pytools platformdirs mako
python3 -m pip download -q --no-deps --no-binary=pycuda -d "$work" pycuda
"$PYTHON312" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "numpy>=2" setuptools wheel pytools platformdirs mako siphash24
mkdir "$work/stub"
echo "" | gcc -shared -Wl,-soname,libcuda.so.1 -o "$work/stub/libcuda.so" -x c -
tar -xzf "$work"/pycuda-*.tar.gz -C "$work"
(
    cd "$work"/pycuda-*/
    "$work/venv/bin/python" configure.py --cuda-root="$CUDA_ROOT" \
        --cudadrv-lib-dir="$work/stub" --no-cuda-enable-curand
    LDCXXSHARED="g++ -shared -Wl,--no-as-needed" LDSHARED="gcc -shared -Wl,--no-as-needed" \
        "$work/venv/bin/python" setup.py -q build_ext -j"$(nproc)" bdist_wheel
)
cp "$work"/pycuda-*/dist/*.whl .whl/
ls .whl
