"""The IR as a picture (comp.draw, ngnn show-ir --out) and the plots of train and bench."""
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.cli import main
from ngnn.train import Trainer

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gat_cora():
    data = datasets.load("cora")
    model = nn.GAT(data.num_features, hidden=8, heads=8, num_classes=data.num_classes)
    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.005))
    trainer.train_step.transform()
    yield model, trainer.train_step
    trainer.transformer.close()


def clusters(source):
    return re.findall(r"subgraph (cluster_\w+)", source)


def test_dot_source_has_one_cluster_per_fused_group(gat_cora, tmp_path):
    _, comp = gat_cora
    path = comp.draw(tmp_path / "gat.dot")
    source = open(path).read()
    assert len(comp.fusion_groups) > 1
    assert sorted(clusters(source)) == sorted(f"cluster_{g.name}" for g in comp.fusion_groups)
    # Edge and node scopes are coloured apart; stored edge values are marked.
    assert "#fdd49e" in source and "#c6dbef" in source
    assert "stored" in source and "peripheries=2" in source


def test_every_pass_can_be_drawn_and_groups_only_exist_after_fusion(gat_cora, tmp_path):
    _, comp = gat_cora
    passes = [name for name, _ in comp.ir_history]
    assert [name for name, _ in comp.ir_snapshots] == passes
    for name in passes:
        source = open(comp.draw(tmp_path / f"{name}.dot", after=name)).read()
        before_fusion = passes.index(name) < passes.index("Fusion")
        assert (clusters(source) == []) == before_fusion, name
    with pytest.raises(KeyError, match="no pass named 'Nope'"):
        comp.draw(tmp_path / "x.dot", after="Nope")


def test_picture_names_values_as_the_ir_text_does(gat_cora):
    _, comp = gat_cora
    text = comp.ir_history[-1][1]
    snapshot = comp.snapshot()
    named_in_text = set(re.findall(r"(%[\w.]+) :", text))
    drawn = set(snapshot.values)
    assert named_in_text <= drawn


def test_collapse_forward_and_layer_shrink_the_picture(gat_cora, tmp_path):
    model, comp = gat_cora
    full = open(comp.draw(tmp_path / "full.dot")).read()
    collapsed = open(comp.draw(tmp_path / "c.dot", collapse=True)).read()
    assert clusters(collapsed) == []
    for group in comp.fusion_groups:
        assert re.search(rf"\b{group.name} \[label=", collapsed)
    assert len(collapsed) < len(full)

    forward = comp.snapshot().forward()
    assert not any(comp.snapshot().values[n].is_assign for n in forward)
    forward_source = open(comp.draw(tmp_path / "f.dot", forward=True)).read()
    assert "assign" not in forward_source and len(forward_source) < len(full)

    conv1, conv2 = (layer.parameters() for _, layer in model.layers)
    first = comp.snapshot().layer(conv1)
    second = comp.snapshot().layer(conv2)
    names = comp.snapshot().variables
    assert {names[v] for v in conv1} <= first and not {names[v] for v in conv2} & first
    assert {names[v] for v in conv2} <= second and not {names[v] for v in conv1} & second
    assert first and second and not first & second
    with pytest.raises(ValueError, match="not used by this computation"):
        comp.snapshot().layer([ng.variable((2,), name="stranger")])


def test_every_backend_draws_its_own_groups(transformer_factory, tmp_path):
    g = ng.Graph.from_edges([0, 1, 2, 2], [1, 2, 0, 1])
    h = ng.placeholder((3, 4), name="h")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        out = ng.zoomOut(ng.mean([ng.exp(n.h) * 2.0 for n in v.innbs]))
    comp = transformer_factory().computation(out, h)
    source = open(comp.draw(tmp_path / "ir.dot")).read()
    assert len(clusters(source)) == len(comp.fusion_groups)
    assert "multiply(…, 2)" in source          # scalar constants fold into their consumer


def test_png_and_svg_pictures(tmp_path):
    g = ng.Graph.from_edges([0, 1, 2, 2], [1, 2, 0, 1])
    h = ng.placeholder((3, 4), name="h")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        out = ng.zoomOut(sum(ng.exp(n.h) for n in v.innbs))
    with ngt.make_transformer("numpy") as t:
        comp = t.computation(out, h)
        png = comp.draw(tmp_path / "small.png")
        svg = comp.draw(tmp_path / "small.svg")
        assert len(comp.fusion_groups) == 1
    assert open(png, "rb").read(8) == PNG
    assert "<svg" in open(svg).read()


def test_drawing_errors_name_the_problem(gat_cora, tmp_path, monkeypatch):
    _, comp = gat_cora
    with pytest.raises(ValueError, match="must be one of dot, svg, png, pdf"):
        comp.draw(tmp_path / "ir.jpeg")
    monkeypatch.setenv("PATH", str(tmp_path))          # no `dot` program on PATH
    with pytest.raises(RuntimeError, match="Graphviz's 'dot' program"):
        comp.draw(tmp_path / "ir.png", forward=True)
    assert not (tmp_path / "ir.png").exists()
    assert "digraph" in open(comp.draw(tmp_path / "ir.dot")).read()   # source needs no dot


def test_show_ir_draws_the_ir(tmp_path, capsys):
    out = tmp_path / "gcn.png"
    assert main(["show-ir", "--model", "gcn", "--dataset", "cora", "--forward",
                 "--out", str(out)]) == 0
    assert open(out, "rb").read(8) == PNG
    assert "fused groups) drawn to" in capsys.readouterr().out
    dot = tmp_path / "gat.dot"
    assert main(["show-ir", "--model", "gat", "--dataset", "cora", "--format", "dot",
                 "--layer", "conv2", "--collapse", "--out", str(dot)]) == 0
    assert "digraph" in dot.read_text()


@pytest.mark.parametrize("argv, message", [
    (["--format", "png"], "give its file with --out"),
    (["--out", "x.gif"], "must be one of"),
    (["--layer", "conv9", "--out", "x.dot"], "no layer 'conv9'; its layers: conv1, conv2"),
    (["--only", "Nope", "--out", "x.dot"], "no pass named 'Nope'"),
])
def test_show_ir_picture_options_are_checked(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["show-ir", "--model", "gcn", "--dataset", "cora"] + argv) != 0
    assert message in capsys.readouterr().err


def test_train_and_bench_plot(tmp_path, capsys):
    curves, bars = tmp_path / "c.png", tmp_path / "b.png"
    assert main(["train", "--model", "gcn", "--dataset", "cora", "--epochs", "3",
                 "--runs", "2", "--no-progress", "--plot", str(curves)]) == 0
    assert main(["bench", "--model", "gcn", "--dataset", "cora", "--epochs", "2",
                 "--backend", "numpy", "--unfused", "--plot", str(bars)]) == 0
    assert open(curves, "rb").read(8) == PNG and open(bars, "rb").read(8) == PNG
    out = capsys.readouterr().out
    assert f"training curves written to {curves}" in out
    assert "gcn on cora, numpy: " in out and "gcn on cora, numpy, no fusion: " in out
    assert "peak intermediate memory" in out


def test_plot_names_are_checked_before_training(capsys):
    assert main(["train", "--model", "gcn", "--dataset", "cora", "--epochs", "1",
                 "--plot", "curves.txt"]) == 1
    assert "must end in .png, .svg, .pdf" in capsys.readouterr().err


def test_training_history_records_train_accuracy():
    from ngnn import plots
    data = datasets.synthetic("sbm", 300, 4.0, 8, 3, seed=0)
    model = nn.GCN(data.num_features, 8, data.num_classes)
    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.01))
    try:
        history = trainer.fit(2, progress=False)
    finally:
        trainer.transformer.close()
    assert all(0.0 <= record["train_acc"] <= 1.0 for record in history)
    with pytest.raises(ValueError, match="no training history"):
        plots.training_curves([], "x.png")
    with pytest.raises(ValueError, match="no benchmark results"):
        plots.bench_bars([], "x.png")
    assert np.isfinite([r["loss"] for r in history]).all()
