#!/usr/bin/env bash
# Run on the lent NVIDIA machine, in the repository root, with .whl/ carried there (see
# scripts/gpu_wheels.sh): installs the wheels and ngnn (editable) into its python3 and
# checks that PyCUDA sees the device. The image's pip (24) runs setuptools' legacy
# `develop` for `-e .`, which tries to fetch setuptools; --use-pep517 builds the editable
# wheel with the setuptools already installed there.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --use-pep517 -e .
python3 -c "import pycuda.autoinit, pycuda.driver as d; print(d.Device(0).name(), 'CUDA', d.get_version())"
python3 -c "from ngnn.transformers.gpu.runtime import available_runtimes; print('runtimes:', available_runtimes())"
