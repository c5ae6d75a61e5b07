#!/usr/bin/env bash
# The prepared run for a lent NVIDIA machine (docs/gpu_transformer.md, "On an NVIDIA H100"):
# installs ngnn from the wheels in .whl/ (scripts/gpu_wheels.sh, carried there), then runs
# `bench_vs_pyg.py --device gpu`, the GIN-0 epoch against PyG on the device, the GAT kernel
# profile (`ngnn profile`) and every gpu-backend test on CUDA, each under a time limit so
# the whole run ends within 9 minutes 30 seconds (a device call's limit is 10). Every
# step's output goes to $OUT/<step>.log, a line per step to $OUT/summary.txt.
#
#   OUT=/tmp/check bash scripts/gpu_check.sh            # CUDA when nvidia-smi sees a GPU
#   OUT=/tmp/check bash scripts/gpu_check.sh --no-cuda  # the same steps without CUDA
#
# Without CUDA (no GPU, or --no-cuda) the installation and the PyG comparisons are skipped,
# the GPU transformer's own tests run on OpenCL with limits 6 times as long, and the profile
# on a small graph: that checks the script itself.
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
# Against PyG first (the figures to beat), then the GIN-0 graph-classification epoch on
# the device, the GAT kernel profile, and last every test that runs the gpu backend (the
# transformer_factory fixture's "gpu" is CUDA where a device is present, else OpenCL), with
# one line per test so a run cut off by its limit still shows what passed and failed.
if [ $cuda = yes ]; then
    step bench_vs_pyg 170 "$python" benchmarks/bench_vs_pyg.py --device gpu --rounds 1 \
        --epochs 10 --warmup 2 --datasets rmat100k,cora,coauthor_cs
    step graph_classification 80 "$python" benchmarks/graph_classification_vs_pyg.py speed \
        --device gpu --dataset nci1 --epochs 3
else
    echo "bench_vs_pyg, graph_classification: skipped (no CUDA)" | tee -a "$OUT/summary.txt"
fi
step profile_gat $((45 * slack)) "$python" -m ngnn.cli profile --model gat --dataset rmat \
    --num-nodes $nodes --avg-degree 16 --num-features 64 --num-classes 8 --steps 3 --float32-sums
parallel=$("$python" -c "import xdist" 2>/dev/null && echo "-n $(nproc)")
if [ $cuda = yes ]; then
    step tests 170 "$python" -m pytest -v -p no:cacheprovider $parallel -k "gpu or cuda" tests
else   # here: the GPU transformer's own files, to check the script
    step tests $((110 * slack)) "$python" -m pytest -v -p no:cacheprovider $parallel \
        tests/test_gpu_*.py tests/test_nvcc_all_kernels.py
fi
grep -E "(FAILED|ERROR) tests/" "$OUT/tests.log" | sed 's/^\[gw[0-9]*\] //' | sort -u \
    > "$OUT/tests_failed.txt"
echo "tests failed: $(wc -l < "$OUT/tests_failed.txt")" | tee -a "$OUT/summary.txt"
echo "total: $SECONDS s" | tee -a "$OUT/summary.txt"
