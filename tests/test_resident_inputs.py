"""Values kept on the device (`Transformer.resident`) and the bytes a call moves
(`Computation.transfer_bytes`): residents give the same results as the arrays they were
made from on every backend, are checked like arrays, and a Trainer's steps after the first
send no input or graph bytes to the device."""
import numpy as np
import pytest
import scipy.sparse

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.train import Trainer

GPU = "gpu" in ngt.transformer_choices()
needs_gpu = pytest.mark.skipif(not GPU, reason="no GPU runtime (OpenCL or CUDA) here")


def dense_and_sparse_computation(t):
    x = ng.placeholder((6, 4), name="x")
    s = ng.placeholder((6, 4), name="s", sparse=True)
    labels = ng.placeholder((6,), dtype=np.int64, name="labels")
    w = ng.variable((4, 3), initial_value=np.arange(12.0).reshape(4, 3) / 10, name="w")
    logits = ng.dot(x, w) + ng.dot(s, w)
    loss = ng.cross_entropy(logits, labels)
    return t.computation([logits, loss], x, s, labels)


def values():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    s = scipy.sparse.random(6, 4, density=0.4, format="csr", dtype=np.float32, random_state=2)
    return x, s, rng.integers(0, 3, 6)


def test_resident_values_give_the_arrays_results(transformer_factory):
    t = transformer_factory()
    comp = dense_and_sparse_computation(t)
    x, s, labels = values()
    expected = comp(x, s, labels)
    resident = t.resident(x), t.resident(s), t.resident(labels)
    x[:] = 0                                      # a snapshot: later changes do not count
    for _ in range(2):
        for e, a in zip(expected, comp(*resident)):
            np.testing.assert_array_equal(a, e)
        assert comp.transfer_bytes["to_device"] == 0
    # Arrays again, then a mix: each call reads what it is fed.
    mixed = comp(np.zeros_like(x), resident[1], labels)
    np.testing.assert_array_equal(mixed[0], comp(np.zeros_like(x), s, labels)[0])


def test_transfer_bytes_count_what_a_call_copies(transformer_factory):
    t = transformer_factory()
    x = ng.placeholder((5, 3), name="x")
    comp = t.computation(ng.sum(x * 2.0, axis=1), x)
    assert comp.transfer_bytes == {"to_device": 0, "from_device": 0}     # before a call
    xv = np.ones((5, 3), np.float32)
    comp(xv)
    if t.name == "numpy":        # its device is the host's memory: nothing crosses a bus
        assert comp.transfer_bytes == {"to_device": 0, "from_device": 0}
    else:
        assert comp.transfer_bytes == {"to_device": xv.nbytes, "from_device": 5 * 4}
        comp(t.resident(xv))
        assert comp.transfer_bytes == {"to_device": 0, "from_device": 5 * 4}


def test_resident_values_are_checked_like_arrays(transformer_factory):
    t = transformer_factory()
    comp = dense_and_sparse_computation(t)
    x, s, labels = values()
    with pytest.raises(ValueError, match=r"'x' expects shape \(6, 4\), got a resident value "
                                         r"of shape \(4, 6\)"):
        comp(t.resident(x.T), s, labels)
    with pytest.raises(TypeError, match=r"'x' expects float32 values; the resident value "
                                        r"holds float64 \(make it with resident\(value, "
                                        r"dtype=np.float32\)\)"):
        comp(t.resident(x.astype(np.float64)), s, labels)
    with pytest.raises(TypeError, match="'s' is sparse and got a dense resident value"):
        comp(x, t.resident(s.toarray()), labels)
    with pytest.raises(TypeError, match="'x' is dense and got a sparse resident value"):
        comp(t.resident(s), s, labels)
    bad = x.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="'x' contains 1 NaN or Inf value"):
        comp(t.resident(bad), s, labels)
    with pytest.raises(ValueError, match=r"class id 7 is outside \[0, 3\)"):
        comp(x, s, t.resident(np.where(labels == labels[0], 7, labels)))
    other = transformer_factory()
    with pytest.raises(ValueError, match="'x': the resident value was made by another "
                                         "transformer"):
        comp(other.resident(x), s, labels)
    freed = t.resident(x)
    freed.free()
    with pytest.raises(ValueError, match="'x': the resident value was freed"):
        comp(freed, s, labels)
    with pytest.raises(TypeError, match="resident: the value is resident already"):
        t.resident(t.resident(x))


@needs_gpu
def test_resident_memory_is_counted_and_given_back():
    with ngt.make_transformer("gpu") as t:
        before = t.device_allocated
        x = t.resident(np.ones((100, 10), np.float32))
        s = t.resident(scipy.sparse.identity(50, dtype=np.float32, format="csr"))
        assert t.device_allocated - before >= 4000 + 50 * 4
        x.free()
        s.free()
        assert t.device_allocated == before and t.residents == []


def small_trainer(model, backend="gpu", sparse=False, **options):
    data = datasets.synthetic("sbm", 120, 6.0, 16, 3, seed=0)
    net = {"gcn": lambda: nn.GCN(16, 8, 3, seed=0),
           "gat": lambda: nn.GAT(16, hidden=4, heads=2, num_classes=3, seed=0)}[model]()
    t = ngt.make_transformer(backend, **options)
    return Trainer(net, data, optim.Adam(net.parameters(), lr=0.01), transformer=t,
                   sparse=sparse), t


@needs_gpu
@pytest.mark.parametrize("model, sparse", [("gcn", False), ("gat", False), ("gcn", True)])
def test_a_trainer_step_sends_no_input_or_graph_bytes_after_the_first(model, sparse):
    trainer, t = small_trainer(model, sparse=sparse)
    with t:
        losses = [trainer.step() for _ in range(3)]
        sent = trainer.train_step.transfer_bytes
        assert sent["to_device"] == 0 and sent["from_device"] > 0
        trainer.predict()
        trainer.predict()
        assert trainer.evaluate_logits.transfer_bytes["to_device"] == 0
        # The same step fed the host arrays sends them every call (a sparse matrix of the
        # last call's structure only its values).
        features, labels, mask = (trainer.features, trainer.data.labels.astype(np.int64),
                                  trainer.data.train_mask)
        for _ in range(2):
            trainer.train_step(features, labels, mask)
        fed = labels.nbytes + mask.nbytes + (features.data.nbytes if sparse else
                                             features.nbytes)
        assert trainer.train_step.transfer_bytes["to_device"] == fed
    # The residents change nothing in what training computes.
    again, numpy_t = small_trainer(model, backend="numpy", sparse=sparse)
    np.testing.assert_allclose([again.step() for _ in range(3)], losses, rtol=1e-4)


def test_the_cuda_path_is_the_same_code(monkeypatch, tmp_path):
    """The executor on the CUDA runtime (a fake pycuda: kernels do nothing, calls are
    recorded): every step runs the prepared launches, one per kernel, and after the first
    sends nothing to the device."""
    from fake_pycuda import install_fake_pycuda
    from ngnn.transformers.gpu import transformer as gpu_transformer
    from ngnn.transformers.gpu.runtime import CompileCache
    fake = install_fake_pycuda(monkeypatch)
    from ngnn.transformers.gpu.runtime.cuda import CUDARuntime
    cuda = CUDARuntime(cache=CompileCache(tmp_path))
    monkeypatch.setattr(gpu_transformer, "shared_runtime", lambda name: cuda)
    # Programs built on the fake stay out of the process's cache of built programs, where
    # a real CUDA runtime would find them (and the other way round).
    monkeypatch.setattr(gpu_transformer, "_programs", gpu_transformer.BoundedCache(256))
    trainer, t = small_trainer("gat", runtime="cuda", time_kernels=True)
    with t:
        trainer.step()
        kernels = len(trainer.train_step.executor.kernels)
        for _ in range(2):
            start = len(fake.calls)
            trainer.step()
            calls = fake.calls[start:]
            assert trainer.train_step.transfer_bytes["to_device"] == 0
            assert sum(call[0] == "prepared" for call in calls) == kernels
            assert not any(call[0] in ("launch", "htod") for call in calls)
        rows = trainer.train_step.kernel_report()
        assert [row["seconds"] for row in rows] == [pytest.approx(5e-4)] * kernels


def test_a_resident_value_read_as_a_result_or_assigned(transformer_factory):
    t = transformer_factory()
    x = ng.placeholder((3, 2), name="x")
    w = ng.variable((3, 2), initial_value=np.zeros((3, 2)), name="w")
    comp = t.computation([x, ng.assign(w, x)], x)
    value = np.arange(6, dtype=np.float32).reshape(3, 2)
    same, assigned = comp(t.resident(value))
    np.testing.assert_array_equal(same, value)
    np.testing.assert_array_equal(assigned, value)
    np.testing.assert_array_equal(t.variable_value(w), value)
