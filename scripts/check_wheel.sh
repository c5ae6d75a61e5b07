#!/usr/bin/env bash
# Builds ngnn's sdist and wheel (python -m build), installs each into a fresh venv and runs
# the installed `ngnn` from a folder outside the checkout: every module imports and every
# file of the checkout shipped (scripts/check_installed.py), a few epochs of training, the
# same within a memory budget, calibrate and simulate, show-ir. The test suite runs it
# (tests/test_packaging.py); by hand: bash scripts/check_wheel.sh  (about a minute).
#
# Why this way: the tests import the editable checkout, which hides a package that setup.py
# forgets to ship. The venvs read the system's site-packages (numpy, scipy, pyopencl are not
# downloaded again) through a path file, not through --system-site-packages: that option
# would also run the system's .pth files, and the editable install's import hook there
# serves any ngnn.* module missing from the venv's copy out of the checkout (a wheel without
# ngnn.out_of_core then still trains). check_installed.py verifies every ngnn module comes
# from the venv. Building without isolation uses the setuptools already installed, so no
# network is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)
PYTHON=${PYTHON:-python}     # the Python whose site-packages the venvs share
work=$(mktemp -d "${TMPDIR:-/tmp}/ngnn-check-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$PYTHON" -m build --no-isolation --outdir "$work/dist" . >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; echo "check_wheel: python -m build failed" >&2; exit 1; }
wheel=$(ls "$work"/dist/ngnn-*.whl)
sdist=$(ls "$work"/dist/ngnn-*.tar.gz)
"$PYTHON" -c 'import sysconfig; print(*dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib")), sep="\n")' \
    >"$work/system.pth"

check() {   # check NAME ARTIFACT
    local venv="$work/venv-$1" run="$work/run-$1"
    echo "== $1: $(basename "$2")"
    # --without-pip: the system's pip and setuptools, on the path, serve it (ensurepip's
    # setuptools would be older, and without bdist_wheel).
    "$PYTHON" -m venv --without-pip "$venv"
    cp "$work/system.pth" "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    # --force-reinstall: the system's editable ngnn, on the path, would count as installed.
    "$venv/bin/python" -m pip install -q --no-deps --no-index --no-build-isolation \
        --force-reinstall "$2"
    mkdir "$run"
    (
        cd "$run"
        unset PYTHONPATH
        export NGNN_CACHE_DIR="$run/cache"
        set -x
        "$venv/bin/python" "$checkout/scripts/check_installed.py" "$checkout"
        "$venv/bin/ngnn" train --model gcn --dataset cora --epochs 3 --no-progress
        # 4 MiB: small enough that the step runs chunk by chunk (ngnn.out_of_core).
        "$venv/bin/ngnn" train --model gcn --dataset cora --epochs 2 --no-progress \
            --memory-budget 4M | tee chunked.log
        grep -q "memory budget: training step in" chunked.log
        "$venv/bin/ngnn" calibrate --quick --no-mpi --out "$run/profile.json"
        "$venv/bin/ngnn" simulate --model gcn --dataset cora --topology "$run/profile.json"
        "$venv/bin/ngnn" show-ir --model gcn --dataset cora --only BufferSharing >/dev/null
    )
}

check wheel "$wheel"
check sdist "$sdist"
echo "check_wheel: the wheel and the sdist install and run"
