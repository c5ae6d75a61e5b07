"""The `ngnn` command line."""
import re

import numpy as np
import pytest

from ngnn.cli import main

SBM = ["--dataset", "sbm", "--num-nodes", "300", "--avg-degree", "6", "--num-features", "8",
       "--num-classes", "3"]


def test_train_prints_the_final_accuracy_line(capsys):
    code = main(["train", "--model", "gcn", "--dataset", "cora", "--epochs", "3", "--runs",
                 "1", "--no-progress"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"test accuracy: \d+\.\d ± \d+\.\d \(1 runs\)", lines[-1])
    assert any(line.startswith("time per epoch: ") for line in lines)
    assert any(line.startswith("run 1/1 (seed 0): val ") for line in lines)


def test_train_several_runs_and_save(capsys, tmp_path):
    path = tmp_path / "weights.npz"
    code = main(["train", "--model", "sage", *SBM, "--epochs", "5", "--runs", "2",
                 "--no-progress", "--save", str(path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "run 2/2 (seed 1)" in out
    assert out.strip().splitlines()[-1].endswith("(2 runs)")
    with np.load(tmp_path / "weights.run1.npz") as archive:
        assert "model/conv1.w_self" in archive.files
    assert (tmp_path / "weights.run2.npz").exists()


def test_datasets_lists_sizes_and_splits(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    cora = next(line for line in out.splitlines() if line.startswith("cora"))
    assert cora.split() == ["cora", "2708", "10556", "1433", "7", "140", "500", "1000"]
    assert "citeseer" in out


def test_unknown_names_list_the_choices(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--model", "transformer", "--dataset", "cora"])
    err = capsys.readouterr().err
    assert "invalid choice: 'transformer'" in err and "'gcn', 'gat', 'sage', 'gin'" in err
    with pytest.raises(SystemExit):
        main(["train", "--dataset", "imagenet"])
    err = capsys.readouterr().err
    assert "invalid choice: 'imagenet'" in err and "'cora'" in err and "'sbm'" in err
    with pytest.raises(SystemExit):
        main(["train", "--backend", "tpu"])
    assert "'numpy', 'gpu'" in capsys.readouterr().err


def test_bad_values_are_reported(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--dropout", "1.5", "--no-progress"])
    assert exit_info.value.code == 2
    assert "argument --dropout: must be in [0, 1), got 1.5" in capsys.readouterr().err


def test_show_ir_prints_each_pass(capsys):
    assert main(["show-ir", "--model", "gat", *SBM]) == 0
    out = capsys.readouterr().out
    headers = re.findall(r"^==== IR after (\w+) ====$", out, re.M)
    assert headers[0] == "Trace"
    assert {"OperationBatching", "SimplePrune", "CSE", "Fusion"} <= set(headers)
    assert main(["show-ir", "--model", "gcn", *SBM, "--only", "CSE"]) == 0
    assert re.findall(r"^==== IR after (\w+) ====$", capsys.readouterr().out, re.M) == ["CSE"]
    assert main(["show-ir", "--model", "gcn", *SBM, "--only", "Nope"]) == 2
    assert "passes run: Trace" in capsys.readouterr().err


def test_bench_reports_time_per_epoch(capsys):
    assert main(["bench", "--model", "gcn", *SBM, "--backend", "numpy", "--epochs", "3"]) == 0
    assert re.search(r"gcn on synthetic-sbm, numpy: [\d.]+ ms/epoch", capsys.readouterr().out)


def test_train_native_runs_the_numpy_transformer_with_c_kernels(capsys, monkeypatch):
    """--native: the run's transformer is make_transformer("numpy", native=True), and its
    accuracy is the NumPy transformer's."""
    from ngnn import transformers as ngt
    made = []
    make = ngt.make_transformer

    def recording(*args, **options):
        made.append(options.get("native", False))
        return make(*args, **options)
    monkeypatch.setattr(ngt, "make_transformer", recording)
    lines = {}
    for flags in ([], ["--native"]):
        assert main(["train", "--task", "graph", "--model", "gin", "--dataset", "mutag",
                     "--folds", "2", "--epochs", "2", "--no-progress", *flags]) == 0
        lines[bool(flags)] = capsys.readouterr().out.strip().splitlines()[-1]
    assert made == [False, True]
    assert lines[True] == lines[False]
