"""Sparse input features: sparse placeholders fed CSR matrices, sparse-dense products and
their gradient, dropout of stored values (bit-for-bit the dense dropout's values), the
trainer's sparse path against its dense path, and the errors bad input gets."""
import numpy as np
import pytest
import scipy.sparse

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn.op_graph import Dropout
from ngnn.op_graph.sparse import SparseDropout
from ngnn.train import Trainer, normalize_features, use_sparse

N, F, H = 30, 20, 5


def csr(seed=0, n=N, f=F, density=0.15):
    matrix = scipy.sparse.random(n, f, density=density, format="csr", dtype=np.float32,
                                 random_state=seed)
    matrix.data += 0.5      # away from zero, so every stored value is a real entry
    return matrix


def weights(seed=1):
    return np.random.default_rng(seed).standard_normal((F, H)).astype(np.float32)


def loss_and_grad(x, w_value, rate, seed=3):
    w = ng.variable((F, H), initial_value=w_value, name="w")
    h = ng.dot(ng.dropout(x, rate, seed=seed), w)
    loss = ng.sum(ng.tanh(h) * ng.tanh(h))
    return loss, ng.grad(loss, w)


@pytest.mark.parametrize("rate", [0.0, 0.6])
def test_sparse_product_and_gradient_equal_the_dense_ones(transformer_factory, rate):
    value, w_value = csr(), weights()
    xs = ng.placeholder((N, F), sparse=True, name="xs")
    xd = ng.placeholder((N, F), name="xd")
    t = transformer_factory()
    sparse = t.computation(list(loss_and_grad(xs, w_value, rate)), xs)
    dense = t.computation(list(loss_and_grad(xd, w_value, rate)), xd)
    for _ in range(3):                  # a new mask each call, the same on both paths
        (ls, gs), (ld, gd) = sparse(value), dense(value.toarray())
        np.testing.assert_allclose(ls, ld, rtol=1e-5)
        np.testing.assert_allclose(gs, gd, rtol=1e-5, atol=1e-6)


def test_each_call_sees_its_own_matrix(transformer_factory):
    """New values on the same structure, a new structure (another nnz), then the first
    matrix again: the GPU uploads only the values while the structure stays."""
    w_value = weights()
    xs = ng.placeholder((N, F), sparse=True, name="xs")
    xd = ng.placeholder((N, F), name="xd")
    t = transformer_factory()
    sparse = t.computation(list(loss_and_grad(xs, w_value, 0.0)), xs)
    dense = t.computation(list(loss_and_grad(xd, w_value, 0.0)), xd)
    first = csr(4)
    rescaled = first.copy()
    rescaled.data *= 3.0
    for value in (first, rescaled, csr(5, density=0.3), first):
        (ls, gs), (ld, gd) = sparse(value), dense(value.toarray())
        np.testing.assert_allclose(ls, ld, rtol=1e-5)
        np.testing.assert_allclose(gs, gd, rtol=1e-5, atol=1e-6)


def test_sparse_dropout_keeps_the_dense_values_bit_for_bit(transformer_factory):
    value = csr(2)
    identity = ng.constant(np.eye(F, dtype=np.float32))
    xs = ng.placeholder((N, F), sparse=True, name="xs")
    xd = ng.placeholder((N, F), name="xd")
    t = transformer_factory()
    sparse = t.computation(ng.dot(ng.dropout(xs, 0.5, seed=11), identity), xs)
    dense = t.computation(ng.dropout(xd, 0.5, seed=11) * 1.0, xd)
    for _ in range(2):
        a, b = sparse(value), dense(value.toarray())
        assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist()
        assert 0 < np.count_nonzero(a) < value.nnz


def awkward_csr(n, f, dtype):
    """Random values, with a row holding no values and a full row and a full column, each
    longer than the chunk of values a GPU work-group stages at a time."""
    matrix = scipy.sparse.random(n, f, density=0.05, format="lil", dtype=dtype,
                                 random_state=9)
    matrix[5, :] = 1.0 + np.arange(f, dtype=dtype) / f
    matrix[:, 7] = (2.0 + np.arange(n, dtype=dtype) / n)[:, None]
    matrix[3, :] = 0
    matrix = matrix.tocsr()
    matrix.eliminate_zeros()
    return matrix


# 301 rows fill no whole number of work-groups (2 rows each for 64 or 100 columns, 128 for
# one); 100 columns take two passes of 64 work-items, the second partly idle.
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("rate", [0.0, 0.5])
@pytest.mark.parametrize("columns", [1, 64, 100])
def test_sparse_products_over_empty_long_and_grouped_rows(transformer_factory, dtype, rtol,
                                                          rate, columns):
    """X @ W (over X's rows) and X^T @ D (over its columns, the gradient of W) equal the
    products of the dense kept values, the mask each call draws included."""
    n, f = 301, 300
    value = awkward_csr(n, f, dtype)
    rng = np.random.default_rng(4)
    w_value = rng.standard_normal((f, columns)).astype(dtype)
    d_value = rng.standard_normal((n, columns)).astype(dtype)
    xs = ng.placeholder((n, f), dtype=dtype, sparse=True, name="xs")
    xd = ng.placeholder((n, f), dtype=dtype, name="xd")
    d = ng.placeholder((n, columns), dtype=dtype, name="d")
    w = ng.variable((f, columns), dtype=dtype, initial_value=w_value, name="w")
    h = ng.dot(ng.dropout(xs, rate, seed=13), w)
    t = transformer_factory()
    products = t.computation([h, ng.grad(ng.sum(h * d), w)], xs, d)
    kept_values = t.computation(ng.dropout(xd, rate, seed=13) * 1.0, xd)
    for _ in range(2):
        (xw, xtd), kept = products(value, d_value), kept_values(value.toarray())
        kept = kept.astype(np.float64)
        scale = np.abs(kept) @ np.abs(w_value)
        np.testing.assert_allclose(xw, kept @ w_value, rtol=rtol, atol=rtol * scale.max())
        scale = np.abs(kept.T) @ np.abs(d_value)
        np.testing.assert_allclose(xtd, kept.T @ d_value, rtol=rtol,
                                   atol=rtol * scale.max())


class PartOfALargerGraph(ng.Graph):
    """A graph whose vertices are other ids of a larger graph, as a rank's or a chunk's
    are: dropouts over its rows draw the larger graph's masks at those ids."""

    def global_rows(self, rows):
        return self, "global_node_ids"


def test_sparse_dropout_keyed_by_global_rows_equals_the_dense_one(transformer_factory):
    """The sparse dropout of X @ W and X^T @ D keeps the values the dense dropout keyed by
    the same global ids keeps, not those of the rows' own ids."""
    n, f, h = 120, 200, 64
    g = PartOfALargerGraph.from_edges([0], [1], num_nodes=n)
    g.global_node_ids = np.random.default_rng(3).permutation(1000)[:n]
    value = csr(2, n, f, density=0.2)
    w_value = np.random.default_rng(1).standard_normal((f, h)).astype(np.float32)
    xs = ng.placeholder((n, f), sparse=True, name="xs")
    xd = ng.placeholder((n, f), name="xd")
    w = ng.variable((f, h), initial_value=w_value, name="w")
    product = ng.dot(SparseDropout(xs, 0.5, seed=9, rows=g.global_rows("n")), w)
    t = transformer_factory()
    products = t.computation([product, ng.grad(ng.sum(product * product), w)], xs)
    keyed = t.computation(Dropout(xd, 0.5, seed=9, rows=g.global_rows("n")) * 1.0, xd)
    unkeyed = t.computation(Dropout(xd, 0.5, seed=9) * 1.0, xd)
    (xw, grad), kept = products(value), keyed(value.toarray()).astype(np.float64)
    assert (kept != unkeyed(value.toarray())).any()
    np.testing.assert_allclose(xw, kept @ w_value, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(grad, kept.T @ (2 * xw.astype(np.float64)), rtol=1e-5,
                               atol=1e-3)


def test_sparse_gradient_matches_finite_differences():
    value = csr(4).astype(np.float64)
    w_value = weights(5).astype(np.float64)
    xs = ng.placeholder((N, F), dtype=np.float64, sparse=True, name="xs")
    w = ng.variable((F, H), dtype=np.float64, initial_value=w_value, name="w")
    loss = ng.sum(ng.tanh(ng.dot(xs, w)))
    with ng.transformers.make_transformer("numpy") as t:
        grad = t.computation(ng.grad(loss, w), xs)(value)
    eps, numeric = 1e-6, np.zeros_like(w_value)
    dense = value.toarray()
    for index in np.ndindex(*w_value.shape):
        up, down = w_value.copy(), w_value.copy()
        up[index] += eps
        down[index] -= eps
        numeric[index] = (np.tanh(dense @ up).sum() - np.tanh(dense @ down).sum()) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


# SGD steps by the gradient, so the weights agree as closely as the gradients (the sparse
# and dense products sum in different orders); Adam divides each gradient by its own
# running size, which turns those last-digit differences of a few near-zero gradients into
# differences of about 1e-6 in their weights.
@pytest.mark.parametrize("model", ["gcn", "gat"])
@pytest.mark.parametrize("optimizer, atol", [("sgd", 1e-8), ("adam", 1e-5)])
def test_sparse_and_dense_training_give_the_same_losses_and_weights(model, optimizer, atol):
    data = datasets.load("cora")
    runs = []
    for sparse in (True, False):
        net = nn.GCN(data.num_features, 16, data.num_classes, dropout=0.5) if model == "gcn" \
            else nn.GAT(data.num_features, 8, 8, data.num_classes, dropout=0.6)
        opt = optim.SGD(net.parameters(), lr=0.5, weight_decay=5e-4) if optimizer == "sgd" \
            else optim.Adam(net.parameters(), lr=0.01, weight_decay=5e-4)
        trainer = Trainer(net, data, opt, sparse=sparse)
        assert trainer.x.is_sparse == sparse
        runs.append(([trainer.step() for _ in range(3)], trainer.state()))
        trainer.transformer.close()
    (sparse_losses, sparse_state), (dense_losses, dense_state) = runs
    np.testing.assert_allclose(sparse_losses, dense_losses, rtol=1e-5)
    for name in dense_state:
        np.testing.assert_allclose(sparse_state[name], dense_state[name], rtol=1e-5,
                                   atol=atol, err_msg=name)


def test_embedded_features_are_csr_and_the_trainer_picks_by_density():
    data = datasets.load("cora")
    assert scipy.sparse.isspmatrix_csr(data.features) and data.feature_density < 0.02
    assert use_sparse(data.features) and not use_sparse(data.features, sparse=False)
    assert not use_sparse(np.ones((3, 4))) and use_sparse(np.ones((3, 4)), sparse=True)
    np.testing.assert_array_equal(data.dense_features(), data.features.toarray())


def test_row_normalization_of_csr_equals_the_dense_one():
    value = csr(6)
    value.data[value.indptr[3]:value.indptr[4]] = 0      # an all-zero row stays zero
    value.eliminate_zeros()
    normalized = normalize_features(value)
    assert scipy.sparse.isspmatrix_csr(normalized)
    np.testing.assert_allclose(normalized.toarray(), normalize_features(value.toarray()),
                               rtol=1e-6)     # row sums add in different orders


def test_bad_sparse_input_gets_clear_errors():
    xs = ng.placeholder((N, F), sparse=True, name="xs")
    xd = ng.placeholder((N, F), name="xd")
    w = ng.variable((F, H), initial_value=weights(), name="w")
    with ng.transformers.make_transformer("numpy") as t:
        sparse = t.computation(ng.dot(xs, w), xs)
        dense = t.computation(ng.dot(xd, w), xd)
        with pytest.raises(TypeError, match="'xs' is sparse and expects a scipy.sparse CSR"):
            sparse(csr().toarray())
        with pytest.raises(TypeError, match="'xd' is dense and got a scipy.sparse matrix"):
            dense(csr())
        with pytest.raises(TypeError, match="CSR matrix, got the 'coo' format"):
            sparse(csr().tocoo())
        with pytest.raises(ValueError, match=r"expects shape \(30, 20\).*\(30, 21\)"):
            sparse(csr(f=F + 1))
        bad = csr()
        bad.data[0] = np.nan
        with pytest.raises(ValueError, match="NaN or Inf"):
            sparse(bad)
        with pytest.raises(TypeError, match="results are dense"):
            t.computation(ng.dropout(xs, 0.5), xs)
    with pytest.raises(TypeError, match="sparse tensors feed only ng.dot"):
        ng.exp(xs)
    with pytest.raises(TypeError, match="sparse tensor"):
        ng.dot(ng.variable((H, N), name="v"), xs)
    with pytest.raises(ValueError, match="gradients are taken with respect to dense"):
        ng.grad(ng.sum(ng.dot(xs, w)), xs)
    with pytest.raises(ValueError, match="2-D float"):
        ng.placeholder((N,), sparse=True)


def test_trainer_feeds_dense_features_to_models_that_cannot_take_sparse_ones():
    data = datasets.load("cora")
    gin = nn.GIN(data.num_features, 8, data.num_classes)
    assert not Trainer(gin, data).sparse             # GIN adds features: auto falls back
    with pytest.raises(ValueError, match="GIN cannot take sparse features"):
        Trainer(nn.GIN(data.num_features, 8, data.num_classes), data, sparse=True)


@pytest.mark.parametrize("choice", ["on", "off"])
def test_command_line_forces_either_path(choice, capsys):
    from ngnn.cli import main
    assert main(["train", "--model", "gcn", "--dataset", "cora", "--epochs", "2",
                 "--sparse-features", choice, "--no-progress"]) == 0
    assert "test accuracy:" in capsys.readouterr().out
