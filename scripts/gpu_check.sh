#!/usr/bin/env bash
# The prepared run for a lent NVIDIA machine (docs/gpu_transformer.md, "On an NVIDIA H100"):
# installs ngnn from the wheels in .whl/ (scripts/gpu_wheels.sh, carried there), runs the
# CUDA tests of the graph kernels and of the host side, `bench_vs_pyg.py --device gpu`
# and the kernel profile (`ngnn profile`), each under a time limit so the whole run ends
# within 8 minutes. Every step's output goes to $OUT/<step>.log, a line per step to
# $OUT/summary.txt.
#
#   OUT=/tmp/check bash scripts/gpu_check.sh            # CUDA when nvidia-smi sees a GPU
#   OUT=/tmp/check bash scripts/gpu_check.sh --no-cuda  # the same steps without CUDA
#
# Without CUDA (no GPU, or --no-cuda) the installation and the PyG comparison are skipped,
# the tests run on OpenCL with limits 6 times as long, and the profile on a small graph:
# that checks the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ngnn-gpu-check}
mkdir -p "$OUT"
: > "$OUT/summary.txt"

cuda=no
if [ "${1:-}" != "--no-cuda" ] && command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    cuda=yes
fi
python=$(command -v python3 || command -v python)
nodes=$([ $cuda = yes ] && echo 100000 || echo 2000)
slack=$([ $cuda = yes ] && echo 1 || echo 6)

step() {   # step NAME SECONDS COMMAND...: runs COMMAND under a limit, logs it, goes on
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc, $((SECONDS - start)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
    tail -n 25 "$OUT/$name.log"
}

git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null
echo "cuda: $cuda" | tee -a "$OUT/summary.txt"
if [ $cuda = yes ]; then
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
    step setup 70 bash scripts/gpu_setup.sh
fi
# The transformer_factory fixture's "gpu" is CUDA where a device is present, else OpenCL;
# tests/test_gpu_*.py are the GPU transformer's own files (new ones included), and the
# nvcc test compiles the CUDA rendering of every kernel they generated.
parallel=$("$python" -c "import xdist" 2>/dev/null && echo "-n 8")
tests=(tests/test_gpu_*.py tests/test_graph_ops.py tests/test_resident_inputs.py
       tests/test_kernel_report.py tests/test_nvcc_all_kernels.py)
step tests $((110 * slack)) "$python" -m pytest -q -p no:cacheprovider $parallel "${tests[@]}"
if [ $cuda = yes ]; then
    step bench_vs_pyg 190 "$python" benchmarks/bench_vs_pyg.py --device gpu --rounds 1 \
        --epochs 10 --warmup 2 --datasets rmat100k,cora,coauthor_cs
else
    echo "bench_vs_pyg: skipped (no CUDA)" | tee -a "$OUT/summary.txt"
fi
for model in gat gcn; do
    step "profile_$model" $((45 * slack)) "$python" -m ngnn.cli profile --model $model --dataset rmat \
        --num-nodes $nodes --avg-degree 16 --num-features 64 --num-classes 8 --steps 3 --float32-sums
done
echo "total: $SECONDS s" | tee -a "$OUT/summary.txt"
