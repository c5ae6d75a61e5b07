"""Seed 000's control flow that traces (a for loop over APPNP's hops, conditionals on
constant hyper-parameters), the data-dependent condition that cannot, and the APPNP and
GCNII models with their per-parameter weight decays."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import TracingError, datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.op_graph import Aggregate
from ngnn.train import Trainer

N, F = 10, 4


def symmetric_graph(seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, N - 1, 18), rng.integers(0, N - 1, 18)    # N - 1: isolated
    return ng.Graph.from_edges(np.concatenate([src, dst]), np.concatenate([dst, src]),
                               num_nodes=N)


def propagate_reference(g, x):
    out_degree = np.bincount(g.src, minlength=N).astype(float)
    in_degree = np.bincount(g.dst, minlength=N).astype(float)
    scale = lambda d: np.where(d > 0, 1 / np.sqrt(np.maximum(d, 1)), 0.0)   # noqa: E731
    out = np.zeros_like(x)
    np.add.at(out, g.dst, x[g.src] * scale(out_degree)[g.src, None])
    return out * scale(in_degree)[:, None]


def aggregations(comp):
    return sum(isinstance(op, Aggregate) for op in comp.ordered_ops)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_appnp_hops_are_a_python_loop_that_traces(transformer_factory, k):
    """APPNPConv's `for _ in range(K)` runs while the graph is built: K hops are K
    aggregations in the op-graph, and the result is K steps of personalised PageRank."""
    g, x = symmetric_graph(), np.random.default_rng(1).standard_normal((N, F))
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    with transformer_factory() as t:
        comp = t.computation(nn.APPNPConv(k=k, alpha=0.2, dtype=np.float64)(g, h), h)
        got = comp(x)
        assert aggregations(comp) == k
    want = x
    for _ in range(k):
        want = 0.8 * propagate_reference(g, want) + 0.2 * x
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conditionals_on_constant_hyper_parameters_trace():
    """`if self.weight2 is None` (GCN2Conv), `if len(self.weights) > 1` (ChebConv) and
    `if training` (the models' dropout) are ordinary Python on constants: each choice
    builds a different graph, and every graph runs."""
    g = symmetric_graph(2)
    x = np.random.default_rng(3).standard_normal((N, F)).astype(np.float32)
    h = ng.placeholder((N, F), name="h")
    shared, separate = nn.GCN2Conv(F, 0.1), nn.GCN2Conv(F, 0.1, shared_weights=False)
    assert len(shared.parameters()) == 1 and len(separate.parameters()) == 2
    cheb1, cheb3 = nn.ChebConv(F, 3, k=1), nn.ChebConv(F, 3, k=3)
    model = nn.APPNP(F, 8, 3, k=2)
    with ngt.make_transformer("numpy") as t:
        comps = {"shared": t.computation(shared(g, h, h), h),
                 "separate": t.computation(separate(g, h, h), h),
                 "cheb1": t.computation(cheb1(g, h), h), "cheb3": t.computation(cheb3(g, h), h),
                 "eval": t.computation(model(g, h), h),
                 "train": t.computation(model(g, h, training=True), h)}
        outs = {name: comp(x) for name, comp in comps.items()}
        assert aggregations(comps["cheb1"]) == 0 and aggregations(comps["cheb3"]) == 2
        assert not np.array_equal(outs["eval"], outs["train"])    # dropout only in training
    for out in outs.values():
        assert np.all(np.isfinite(out))


def test_a_condition_on_a_traced_value_is_still_a_clear_error():
    class Thresholded(nn.Layer):
        """Propagates only where the neighbourhood is large: data-dependent, cannot trace."""

        def __call__(self, g, h):
            with ng.zoomIn(g, node_feat={"h": h}) as v:
                total = sum(n.h for n in v.innbs)
                if ng.sum(total) > 1.0:       # the line the error points at
                    total = total * 2.0
            return ng.zoomOut(total)

    h = ng.placeholder((N, F), name="h")
    with pytest.raises(TracingError) as info:
        Thresholded(0, np.float32)(symmetric_graph(), h)
    message = str(info.value)
    assert "data-dependent control flow" in message
    assert "if ng.sum(total) > 1.0:" in message and "test_propagation.py" in message


def test_optimizers_take_one_weight_decay_per_parameter():
    a = ng.variable((2,), initial_value=np.array([1.0, -1.0]), name="a")
    b = ng.variable((2,), initial_value=np.array([2.0, 0.5]), name="b")
    loss = ng.sum(a * b)
    per_parameter = optim.SGD([a, b], lr=0.1, weight_decay=[0.5, 0.0])
    with ngt.make_transformer("numpy") as t:
        t.computation([loss] + per_parameter.updates(loss))()
        got_a, got_b = t.variable_value(a), t.variable_value(b)
    np.testing.assert_allclose(got_a, [1.0 - 0.1 * (2.0 + 0.5), -1.0 - 0.1 * (0.5 - 0.5)])
    np.testing.assert_allclose(got_b, [2.0 - 0.1 * 1.0, 0.5 - 0.1 * -1.0])
    for bad in ([0.1], [0.1, -0.1], -1.0):
        with pytest.raises(ValueError, match="one per parameter"):
            optim.Adam([a, b], weight_decay=bad)


def test_gcnii_weight_decays_split_convolutions_from_dense_layers():
    model = nn.GCNII(F, 8, 3, num_layers=3)
    decays = model.weight_decays(conv=0.01, dense=5e-4)
    names = [name for name, _ in model.named_parameters()]
    assert len(decays) == len(model.parameters()) == 2 + 3 + 2
    assert {n: d for n, d in zip(names, decays) if d == 0.01} == \
        {"conv1.weight1": 0.01, "conv2.weight1": 0.01, "conv3.weight1": 0.01}
    with pytest.raises(ValueError, match="num_layers"):
        nn.GCNII(F, 8, 3, num_layers=0)


def test_appnp_decays_only_its_first_layers_weights():
    model = nn.APPNP(F, 8, 3)
    names = [name for name, _ in model.named_parameters()]
    assert dict(zip(names, model.weight_decays(first=5e-3))) == \
        {"lin1.weight": 5e-3, "lin1.bias": 0.0, "lin2.weight": 0.0, "lin2.bias": 0.0}


@pytest.fixture(scope="module")
def sbm():
    return datasets.synthetic("sbm", 400, 8, 16, 4, seed=3)


@pytest.mark.parametrize("name", ["appnp", "gcnii"])
def test_models_learn_a_block_model(sbm, name):
    if name == "appnp":
        model = nn.APPNP(sbm.num_features, 16, sbm.num_classes, k=5)
        decay = model.weight_decays(first=5e-3)
    else:
        model = nn.GCNII(sbm.num_features, 16, sbm.num_classes, num_layers=4)
        decay = model.weight_decays(conv=0.01, dense=5e-4)
    trainer = Trainer(model, sbm, optim.Adam(model.parameters(), lr=0.02, weight_decay=decay),
                      normalize=False)
    history = trainer.fit(60, progress=False)
    assert history[-1]["loss"] < history[0]["loss"]
    assert trainer.evaluate()["test"] > 0.6        # four balanced classes: chance is 25%
    with pytest.raises(ValueError, match="full graph"):
        model([sbm.graph], ng.placeholder((sbm.num_nodes, sbm.num_features)))


@pytest.mark.parametrize("model", [["appnp"], ["gcnii", "--num-layers", "3"]])
def test_the_command_line_trains_appnp_and_gcnii(capsys, model):
    from ngnn.cli import main
    code = main(["train", "--model", *model, "--dataset", "sbm", "--num-nodes", "300",
                 "--epochs", "3", "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"recipe: {model[0]} on sbm (" in out and ": hidden 64, " in out
    assert out.strip().splitlines()[-1].startswith("test accuracy: ")
