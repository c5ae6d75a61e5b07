"""Optimizers, models and the Trainer: updates against NumPy, learning, determinism,
checkpoints."""
import dataclasses

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.nn.models import with_self_loops
from ngnn.train import Trainer, accuracy, normalize_features


def quadratic(target):
    """loss = sum(0.5 * (w * x - target)^2) with gradient (w * x - target) * x."""
    w = ng.variable((3,), initial_value=np.array([1.0, -2.0, 0.5]), name="w")
    x = ng.placeholder((3,), name="x")
    loss = ng.sum(0.5 * (w * x - target) ** 2)
    return w, x, loss


X = np.array([0.5, 1.5, -1.0], dtype=np.float32)
TARGET = np.array([1.0, 0.0, 2.0], dtype=np.float32)


def run_steps(opt_factory, steps=4):
    w, x, loss = quadratic(TARGET)
    opt = opt_factory([w])
    with ngt.make_transformer("numpy") as t:
        step = t.computation([loss] + opt.updates(loss), x)
        values = []
        for _ in range(steps):
            step(X)
            values.append(t.variable_value(w))
    return values


def numpy_grad(w):
    return (w * X - TARGET) * X


def test_sgd_momentum_matches_numpy():
    lr, momentum, decay = 0.1, 0.9, 0.01
    got = run_steps(lambda p: optim.SGD(p, lr=lr, momentum=momentum, weight_decay=decay))
    w, buf = np.array([1.0, -2.0, 0.5]), np.zeros(3)
    for value in got:
        buf = momentum * buf + numpy_grad(w) + decay * w
        w = w - lr * buf
        np.testing.assert_allclose(value, w, rtol=1e-5, atol=1e-6)


def test_plain_sgd_matches_numpy():
    got = run_steps(lambda p: optim.SGD(p, lr=0.2))
    w = np.array([1.0, -2.0, 0.5])
    for value in got:
        w = w - 0.2 * numpy_grad(w)
        np.testing.assert_allclose(value, w, rtol=1e-5, atol=1e-6)


def test_adam_with_weight_decay_matches_numpy():
    lr, (b1, b2), eps, decay = 0.05, (0.9, 0.999), 1e-8, 0.1
    got = run_steps(lambda p: optim.Adam(p, lr=lr, betas=(b1, b2), eps=eps,
                                         weight_decay=decay), steps=5)
    w, m, v = np.array([1.0, -2.0, 0.5]), np.zeros(3), np.zeros(3)
    for t, value in enumerate(got, start=1):
        # torch.optim.Adam's rule: L2 decay added to the gradient, then bias-corrected moments.
        g = numpy_grad(w) + decay * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        np.testing.assert_allclose(value, w, rtol=1e-5, atol=1e-6)


def per_parameter_adam(opt, grads):
    """The Adam rule one parameter at a time (the update before parameters were packed),
    from `opt`'s own step counter and fresh per-parameter moments: the reference."""
    step = opt.step + 1.0
    scale = opt.rate * ng.sqrt(1.0 - ng.constant(opt.beta2) ** step) / \
        (1.0 - ng.constant(opt.beta1) ** step)
    eps = opt.eps * ng.sqrt(1.0 - ng.constant(opt.beta2) ** step)
    updates = [ng.assign(opt.step, step)]
    for p, g in zip(opt.params, grads):
        m = ng.variable(p.shape, dtype=p.dtype, initial_value=0.0, trainable=False)
        v = ng.variable(p.shape, dtype=p.dtype, initial_value=0.0, trainable=False)
        new_m = opt.beta1 * m + (1.0 - opt.beta1) * g
        new_v = opt.beta2 * v + (1.0 - opt.beta2) * g * g
        updates += [ng.assign(m, new_m), ng.assign(v, new_v),
                    ng.assign(p, p - scale * new_m / (ng.sqrt(new_v) + eps))]
    return updates


def test_adam_over_packed_parameters_equals_the_per_parameter_rule_bit_for_bit(
        transformer_factory):
    """Adam runs over the parameters laid end to end (one moment buffer per dtype, a
    whole-buffer op per step of the rule): float32 and float64 parameters of several
    shapes, one weight decay each, give the per-parameter rule's values bit for bit."""
    def model():
        rng = np.random.default_rng(3)
        shapes = [((4, 3), np.float32), ((3,), np.float32), ((2, 2), np.float64),
                  ((5,), np.float32), ((1,), np.float64)]
        params = [ng.variable(shape, dtype=dtype, initial_value=rng.standard_normal(shape),
                              name=f"p{i}") for i, (shape, dtype) in enumerate(shapes)]
        x = ng.placeholder((4,), dtype=np.float64, name="x")
        loss = ng.sum(ng.tanh(ng.reshape(ng.cast(x, np.float32), (1, 4)) @ params[0] + params[1]) ** 2)
        loss = loss + ng.cast(ng.sum(params[2] * params[2]) + ng.sum(params[4] * x[0]),
                              np.float32) + ng.sum(params[3] * params[3] * params[3])
        return params, x, loss

    decays = [0.0, 0.1, 0.01, 0.0, 0.5]
    xv = np.random.default_rng(4).standard_normal(4)
    runs = []
    for packed in (True, False):
        params, x, loss = model()
        opt = optim.Adam(params, lr=0.05, weight_decay=decays)
        updates = opt.updates(loss) if packed else per_parameter_adam(
            opt, opt.gradients(loss))
        t = transformer_factory()
        step = t.computation([loss] + updates, x)
        for _ in range(4):
            step(xv)
        runs.append([t.variable_value(p) for p in params])
    for packed, reference in zip(*runs):
        assert packed.dtype == reference.dtype
        assert packed.tobytes() == reference.tobytes()


def test_adam_state_is_one_moment_pair_per_dtype():
    params = [ng.variable((2, 3), name="a"), ng.variable((4,), name="b"),
              ng.variable((3,), dtype=np.float64, name="c")]
    state = dict(optim.Adam(params).named_state())
    assert {name: v.shape for name, v in state.items()} == {
        "adam.step": (), "adam_m": (10,), "adam_v": (10,), "adam_m.float64": (3,),
        "adam_v.float64": (3,)}
    assert state["adam_m.float64"].dtype == np.float64


def test_optimizer_arguments_are_checked():
    w = ng.variable((2,), name="w")
    with pytest.raises(TypeError, match="ng.variable"):
        optim.SGD([ng.placeholder((2,))], lr=0.1)
    with pytest.raises(ValueError, match="lr must be positive"):
        optim.Adam([w], lr=0.0)
    with pytest.raises(ValueError, match="listed twice"):
        optim.SGD([w, w], lr=0.1)
    with pytest.raises(ValueError, match="scalar"):
        optim.SGD([w], lr=0.1).updates(w * 2.0)


@pytest.mark.parametrize("step_size, gamma", [(50, 0.5), (3, 0.1), (1, 0.9), (7, 1.5)])
def test_step_lr_rates_equal_torchs_step_lr(step_size, gamma):
    import torch
    w = ng.variable((2,), name="w")
    ours = optim.Adam([w], lr=0.01, schedule=optim.StepLR(step_size, gamma))
    theirs = torch.optim.Adam([torch.zeros(2, requires_grad=True)], lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(theirs, step_size=step_size, gamma=gamma)
    for epoch in range(200):
        assert ours.lr_at(epoch) == scheduler.get_last_lr()[0], epoch
        theirs.step()
        scheduler.step()


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_scheduled_rate_changes_without_recompiling(transformer_factory, name):
    """Each epoch's rate is written to a variable the compiled step reads: the steps equal
    NumPy's at those rates, and no program is generated after the first step."""
    schedule = optim.StepLR(step_size=2, gamma=0.5)
    w, x, loss = quadratic(TARGET)
    opt = optim.SGD([w], lr=0.2, schedule=schedule) if name == "sgd" else \
        optim.Adam([w], lr=0.05, schedule=schedule)
    t = transformer_factory()
    step = t.computation([loss] + opt.updates(loss), x)
    expected, m, v = np.array([1.0, -2.0, 0.5]), np.zeros(3), np.zeros(3)
    for epoch in range(6):
        opt.start_epoch(t, epoch)
        step(X)
        if epoch == 0:
            compiled = t.compilations
        lr, g = schedule.rate(opt.lr, epoch), numpy_grad(expected)
        assert lr == opt.lr * 0.5 ** (epoch // 2)
        if name == "sgd":
            expected = expected - lr * g
        else:
            m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
            k = epoch + 1
            expected = expected - lr * (m / (1 - 0.9 ** k)) / \
                (np.sqrt(v / (1 - 0.999 ** k)) + 1e-8)
        np.testing.assert_allclose(t.variable_value(w), expected, rtol=1e-5, atol=1e-6)
    assert t.compilations == compiled


def test_schedule_arguments_are_checked():
    for step_size in (0, -3, 2.5, True, None):
        with pytest.raises(ValueError, match="step_size .* must be an integer >= 1"):
            optim.StepLR(step_size, 0.5)
    for gamma in (0.0, -0.5, float("nan"), float("inf"), "0.5"):
        with pytest.raises(ValueError, match="gamma .* must be a finite number > 0"):
            optim.StepLR(10, gamma)
    with pytest.raises(TypeError, match="schedule must be an optim.StepLR"):
        optim.Adam([ng.variable((2,), name="w")], lr=0.1, schedule=0.5)


def test_trainer_fit_steps_the_schedule_every_epoch(sbm):
    """Trainer.fit (no validation rows, so the last weights stay) at a halving rate equals
    plain steps with each epoch's rate written by hand, and differs from a constant rate."""
    unvalidated = dataclasses.replace(sbm, val_mask=np.zeros(sbm.num_nodes, bool))

    def trainer(schedule):
        model = nn.GCN(sbm.num_features, 16, sbm.num_classes, seed=1)
        opt = optim.SGD(model.parameters(), lr=0.5, schedule=schedule)
        return Trainer(model, unvalidated, opt, seed=1, normalize=False)
    fitted = trainer(optim.StepLR(1, 0.5))
    fitted.fit(4, progress=False)
    stepped = trainer(optim.StepLR(1, 0.5))
    for epoch in range(4):
        stepped.transformer.set_variable(stepped.optimizer.rate, 0.5 * 0.5 ** epoch)
        stepped.step()
    constant = trainer(None)
    constant.fit(4, progress=False)
    assert fitted.transformer.variable_value(fitted.optimizer.rate) == 0.5 * 0.5 ** 3
    for name, value in stepped.state().items():
        np.testing.assert_array_equal(fitted.state()[name], value, err_msg=name)
    assert not np.array_equal(fitted.state()["model/" + fitted.model.named_parameters()[0][0]],
                              constant.state()["model/" + fitted.model.named_parameters()[0][0]])


def test_accuracy_and_feature_normalization():
    logits = np.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0]])
    assert accuracy(logits, [0, 1, 1]) == pytest.approx(2 / 3)
    assert accuracy(logits, [0, 1, 1], [True, False, True]) == 0.5
    with pytest.raises(ValueError, match="no rows"):
        accuracy(logits, [0, 1, 1], [False] * 3)
    x = normalize_features(np.array([[1.0, 3.0], [0.0, 0.0]]))
    np.testing.assert_allclose(x, [[0.25, 0.75], [0.0, 0.0]])


def test_self_loops_are_not_doubled():
    g = ng.Graph.from_edges([0, 1, 1], [1, 0, 1], num_nodes=3)
    looped = with_self_loops(g)
    assert looped.num_edges == 2 + 3
    assert with_self_loops(g) is looped
    assert np.count_nonzero(looped.src == looped.dst) == 3


@pytest.fixture(scope="module")
def sbm():
    return datasets.synthetic("sbm", 400, 8, 16, 4, seed=3)


def make(name, data, seed=0, hidden=16):
    models = {
        "gcn": lambda: nn.GCN(data.num_features, hidden, data.num_classes, seed=seed),
        "gat": lambda: nn.GAT(data.num_features, hidden=4, heads=2,
                              num_classes=data.num_classes, seed=seed),
        "sage": lambda: nn.GraphSAGE(data.num_features, hidden, data.num_classes, seed=seed),
        "gin": lambda: nn.GIN(data.num_features, hidden, data.num_classes, seed=seed),
    }
    model = models[name]()
    return Trainer(model, data, optim.Adam(model.parameters(), lr=0.02, weight_decay=5e-4),
                   seed=seed, normalize=False)


@pytest.mark.parametrize("name", ["gcn", "gat", "sage", "gin"])
def test_models_learn_a_block_model(sbm, name):
    trainer = make(name, sbm)
    history = trainer.fit(60, progress=False)
    assert history[-1]["loss"] < history[0]["loss"]
    # Four balanced classes: chance is 25%.
    assert trainer.evaluate()["test"] > 0.6
    assert trainer.predict().shape == (sbm.num_nodes, sbm.num_classes)


def test_training_is_deterministic_for_a_seed(sbm):
    losses = [[r["loss"] for r in make("gcn", sbm, seed=s).fit(8, progress=False)]
              for s in (5, 5, 6)]
    assert losses[0] == losses[1]
    assert losses[0] != losses[2]


def test_early_stopping_restores_the_best_weights(sbm):
    trainer = make("gcn", sbm)
    history = trainer.fit(200, patience=5, progress=False)
    assert len(history) < 200
    best = max(r["val_acc"] for r in history)
    assert trainer.evaluate()["val"] == best


def test_without_validation_rows_every_epoch_trains_and_the_last_weights_stay(
        sbm, transformer_factory):
    """An empty val_mask (PyG's and DGL's examples then train without early stopping):
    fit runs every epoch whatever the patience, keeps the last weights (those of as many
    plain steps) and reports the val accuracy and loss as NaN; the test accuracy stands."""
    def trainer(data):
        model = nn.GCN(data.num_features, 16, data.num_classes, seed=1)
        return Trainer(model, data, optim.Adam(model.parameters(), lr=0.02), seed=1,
                       normalize=False, transformer=transformer_factory())
    unvalidated = dataclasses.replace(sbm, val_mask=np.zeros(sbm.num_nodes, bool))
    fitted = trainer(unvalidated)
    history = fitted.fit(12, patience=1, progress=False)
    assert len(history) == 12
    assert all(np.isnan(r["val_acc"]) and np.isnan(r["val_loss"]) for r in history)
    assert all(np.isfinite(r["loss"]) and 0 <= r["train_acc"] <= 1 for r in history)
    stepped = trainer(sbm)
    losses = [stepped.step() for _ in range(12)]
    assert [r["loss"] for r in history] == losses
    for name, value in stepped.state().items():
        np.testing.assert_array_equal(fitted.state()[name], value, err_msg=name)
    result = fitted.evaluate()
    assert np.isnan(result["val"]) and result["test"] == stepped.evaluate()["test"] > 0.6


def test_checkpoint_round_trip(sbm, tmp_path):
    trainer = make("gcn", sbm)
    trainer.fit(5, progress=False)
    path = tmp_path / "model.npz"
    trainer.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["model.npz"]
    restored = make("gcn", sbm)
    restored.load(path)
    np.testing.assert_array_equal(restored.predict(), trainer.predict())
    for name, value in trainer.state().items():
        np.testing.assert_array_equal(restored.state()[name], value)
    # The optimizer state and the step number came along, so training resumes exactly.
    assert [restored.step() for _ in range(3)] == [trainer.step() for _ in range(3)]


def test_corrupt_or_mismatched_checkpoints_are_rejected(sbm, tmp_path):
    trainer = make("gcn", sbm)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip archive at all")
    with pytest.raises(ValueError, match="corrupt"):
        trainer.load(garbage)
    good = tmp_path / "good.npz"
    trainer.save(good)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match="corrupt"):
        trainer.load(truncated)
    np.savez(tmp_path / "stepless.npz", **trainer.state())
    with pytest.raises(ValueError, match="'trainer/steps' is missing"):
        trainer.load(tmp_path / "stepless.npz")
    wider = make("gcn", sbm, hidden=32)
    with pytest.raises(ValueError, match=r"'model/conv1.weight' has shape \(16, 16\)"):
        wider.load(good)
    other = make("sage", sbm)
    with pytest.raises(ValueError, match="missing .*model/conv1.w_self"):
        other.load(good)
    with pytest.raises(FileNotFoundError):
        trainer.load(tmp_path / "absent.npz")


@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_training_steps_agree_with_numpy(sbm, transformer_factory, name):
    # Dropout included: the Philox masks are the same numbers on every backend.
    def run(transformer):
        model = make(name, sbm, seed=2).model
        trainer = Trainer(model, sbm, optim.Adam(model.parameters(), lr=0.02, weight_decay=5e-4),
                          seed=2, normalize=False, transformer=transformer)
        losses = [trainer.step() for _ in range(4)]
        return losses, trainer.state(), trainer.predict()

    with ngt.make_transformer("numpy") as reference:
        expected = run(reference)
    losses, state, logits = run(transformer_factory())
    np.testing.assert_allclose(losses, expected[0], rtol=1e-4)
    for key, value in state.items():
        np.testing.assert_allclose(value, expected[1][key], rtol=1e-4, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(logits, expected[2], rtol=1e-4, atol=1e-5)
