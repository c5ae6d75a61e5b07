"""Bad command lines: every numeric option is checked (NaN and infinities too), a diverging
run points at --debug-nans, which names the first op producing a non-finite value, and
NumPy-only commands never touch OpenCL."""
import subprocess
import sys

import pytest

from ngnn import transformers as ngt
from ngnn.cli import main

SBM = ["--dataset", "sbm", "--num-nodes", "300", "--avg-degree", "6", "--num-features", "8",
       "--num-classes", "3"]

BAD = [
    ("--patience", "-3", "must be at least 0, got -3"),     # 0: no early stopping
    ("--patience", "2.5", "expected an integer, got '2.5'"),
    ("--lr", "nan", "must be a finite number, got nan"),
    ("--lr", "inf", "must be a finite number, got inf"),
    ("--lr", "-inf", "must be a finite number, got -inf"),
    ("--lr", "-0.1", r"must be in (0, inf), got -0.1"),
    ("--lr", "0", r"must be in (0, inf), got 0"),
    ("--lr", "fast", "expected a number, got 'fast'"),
    ("--weight-decay", "-1e-4", r"must be in [0, inf), got -1e-4"),
    ("--weight-decay", "nan", "must be a finite number"),
    ("--dropout", "1", r"must be in [0, 1), got 1"),
    ("--dropout", "-0.5", r"must be in [0, 1), got -0.5"),
    ("--dropout", "NaN", "must be a finite number, got NaN"),
    ("--avg-degree", "inf", "must be a finite number, got inf"),
    ("--avg-degree", "nan", "must be a finite number, got nan"),
    ("--avg-degree", "0", r"must be in (0, inf), got 0"),
    ("--avg-degree", "-2", r"must be in (0, inf), got -2"),
    ("--epochs", "0", "must be at least 1, got 0"),
    ("--epochs", "1e3", "expected an integer, got '1e3'"),
    ("--hidden", "0", "must be at least 1, got 0"),
    ("--hidden", "nan", "expected an integer, got 'nan'"),
    ("--heads", "-1", "must be at least 1, got -1"),
    ("--runs", "0", "must be at least 1, got 0"),
    ("--num-nodes", "0", "must be at least 1, got 0"),
    ("--num-features", "-8", "must be at least 1, got -8"),
    ("--num-classes", "1", "must be at least 2, got 1"),
    ("--seed", "-1", "must be at least 0, got -1"),
    ("--data-seed", "-5", "must be at least 0, got -5"),
]


@pytest.mark.parametrize("option, value, message", BAD)
def test_numeric_options_are_validated(capsys, option, value, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *SBM, f"{option}={value}", "--no-progress"])
    assert exit_info.value.code == 2
    assert f"argument {option}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("command, option, value", [
    ("bench", "--epochs", "1"), ("bench", "--lr", "inf"), ("show-ir", "--dropout", "2"),
    ("show-ir", "--avg-degree", "nan"),
])
def test_other_commands_validate_too(capsys, command, option, value):
    with pytest.raises(SystemExit):
        main([command, *SBM, option, value])
    assert f"argument {option}: " in capsys.readouterr().err


DIVERGING = ["train", "--model", "gcn", *SBM, "--lr", "1e30", "--epochs", "10", "--no-progress"]


@pytest.mark.parametrize("backend", ngt.transformer_choices())
def test_a_diverging_run_with_debug_nans_names_the_first_non_finite_op(capsys, backend):
    assert main(DIVERGING + ["--backend", backend, "--debug-nans"]) == 1
    err = capsys.readouterr().err
    # The product is accumulated in float64 (WideAccumulation), where 1e30-sized weights
    # stay finite; its rounding to float32 is where the infinities appear.
    assert "ngnn train: error: debug_nans: cast <Cast [300, 3] float32> is the first op to " \
           "produce a non-finite value" in err
    assert "nn/layers.py" in err            # the line of the GCN layer that built it
    assert "input <Dot [300, 3] float64>: range [" in err


def test_a_diverging_run_without_debug_nans_says_to_rerun_with_it(capsys):
    assert main(DIVERGING) == 1
    err = capsys.readouterr().err
    assert "training diverged: loss is nan" in err
    assert "rerun with" in err and "ngnn train --debug-nans" in err


@pytest.mark.parametrize("argv", [
    ["datasets"],
    ["train", *SBM, "--epochs", "1", "--no-progress"],
    ["show-ir", *SBM, "--only", "CSE"],
])
def test_numpy_only_commands_do_not_import_opencl(argv):
    code = ("import sys; from ngnn.cli import main; "
            f"assert main({argv!r}) == 0; "
            "assert 'pyopencl' not in sys.modules and 'pycuda' not in sys.modules, "
            "sorted(m for m in sys.modules if 'cl' in m)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
