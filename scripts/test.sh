#!/usr/bin/env bash
# Sets up and runs the whole test suite (NumPy and GPU-on-OpenCL backends, nvcc compiles).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python -m pytest -q -p no:cacheprovider tests "$@"
