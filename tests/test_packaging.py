"""ngnn as a user installs it: built into a wheel and an sdist, each installed into a fresh
venv and run from outside the checkout (scripts/check_wheel.sh, about 30 s on 2 cores). The
other tests import the editable checkout, which hides a module or a data file that setup.py
forgets to ship."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_wheel_and_sdist_install_and_run(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "scripts" / "check_wheel.sh")],
                            env={**os.environ, "PYTHON": sys.executable,
                                 "TMPDIR": str(tmp_path)},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert "check_wheel: the wheel and the sdist install and run" in result.stdout
    assert result.stdout.count("none of the checkout's missing") == 2
