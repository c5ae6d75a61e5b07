"""SplitContractions: a product with a small output and a long inner axis becomes a batched
product over slices of that axis, summed. The GPU transformer runs it by default; any
transformer takes it as a pass."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.passes import SplitContractions


@pytest.mark.parametrize("rows", [1000, 1003, 100])
def test_results_are_preserved(transformer_factory, rows):
    """X^T D (the transpose read in place), with and without a remainder past the slices,
    one too short to split, and gradients through the products."""
    rng = np.random.default_rng(rows)
    x = ng.placeholder((rows, 20), name="x")
    d = ng.placeholder((rows, 3), name="d")
    w = ng.variable((20, 3), initial_value=rng.normal(size=(20, 3)).astype(np.float32),
                    name="w")
    loss = ng.sum(ng.dot(ng.transpose(x), d) * w) + ng.sum(ng.dot(x, w) * d)
    grad = ng.grad(loss, [w])[0]
    xv, dv = (rng.normal(size=s).astype(np.float32) for s in ((rows, 20), (rows, 3)))
    outputs = []
    for split in (True, False):
        passes = [SplitContractions(tile=4, work_groups=16, min_slice=64)] if split else []
        comp = transformer_factory(passes=passes).computation([loss, grad], x, d)
        outputs.append(comp(xv, dv))
        if split:
            # 5 output tiles of 4 x 4: 4 slices fill the 16 work-groups asked for.
            assert ("Float32[4,20,3] = dot(" in comp.ir) == (rows >= 128), comp.ir
    for ours, plain in zip(*outputs):
        np.testing.assert_allclose(ours, plain, rtol=2e-5, atol=2e-5)


def test_only_long_products_with_few_output_tiles_are_split():
    x = ng.placeholder((4096, 64), name="x")
    d = ng.placeholder((4096, 16), name="d")
    w = ng.placeholder((64, 16), name="w")
    split = SplitContractions(tile=16, work_groups=512, min_slice=256)
    with ngt.make_transformer("numpy", passes=[split]) as t:
        gradient = t.computation(ng.dot(ng.transpose(x), d), x, d)
        forward = t.computation(ng.dot(x, w), x, w)
        gradient.plan()
        forward.plan()
    # 4 output tiles over 4096 rows: 16 slices of 256 rows (the most min_slice allows),
    # each slice of X^T a reshape of X's transpose, not a copy.
    assert "Float32[16,64,16] = dot(" in gradient.ir
    assert "slice(" not in gradient.ir
    assert forward.ir.count("dot(") == 1 and "sum(" not in forward.ir


def test_empty_products_are_left_alone():
    """(0, 3) @ (3, 4), edge features of a graph without edges: no tiles, nothing to split."""
    e = ng.placeholder((0, 3), name="e")
    w = ng.placeholder((3, 4), name="w")
    split = SplitContractions(tile=16, work_groups=512, min_slice=256)
    with ngt.make_transformer("numpy", passes=[split]) as t:
        out = t.computation(ng.dot(e, w), e, w)(np.zeros((0, 3), np.float32),
                                                 np.ones((3, 4), np.float32))
    assert out.shape == (0, 4)


def gemm_work_groups(comp):
    return [int(np.prod(k.global_size) // np.prod(k.local_size))
            for k in comp.executor.kernels if k.template == "gemm.j2"]


def test_the_gpu_splits_a_weight_gradient_into_many_work_groups():
    assert "gpu" in ngt.transformer_choices()
    rows = 50_000
    x = ng.placeholder((rows, 64), name="x")
    d = ng.placeholder((rows, 16), name="d")
    rng = np.random.default_rng(0)
    xv, dv = rng.random((rows, 64), np.float32), rng.random((rows, 16), np.float32)
    expected = xv.T.astype(np.float64) @ dv
    with ngt.make_transformer("gpu") as t:
        comp = t.computation(ng.dot(ng.transpose(x), d), x, d)
        np.testing.assert_allclose(comp(xv, dv), expected, rtol=1e-5)
        assert max(gemm_work_groups(comp)) >= 128   # whole: 4, one per 16 x 16 output tile
    # debug_nans names the user's ops, so it keeps the product whole (and one work-item
    # sums all 50,000 terms in float32).
    with ngt.make_transformer("gpu", debug_nans=True) as t:
        comp = t.computation(ng.dot(ng.transpose(x), d), x, d)
        np.testing.assert_allclose(comp(xv, dv), expected, rtol=1e-4)     # 50,000 rows
        assert gemm_work_groups(comp) == [4]


def test_slices_divide_the_axis_where_they_can():
    """4000 rows, at most 15 slices of 256: 10 slices of 400 rows cover the axis, so no
    product over a remainder of rows (a launch reading both operands) is left."""
    x = ng.placeholder((4000, 64), name="x")
    d = ng.placeholder((4000, 16), name="d")
    split = SplitContractions(tile=16, work_groups=512, min_slice=256)
    with ngt.make_transformer("numpy", passes=[split]) as t:
        gradient = t.computation(ng.dot(ng.transpose(x), d), x, d)
        gradient.plan()
    assert "Float32[10,64,16] = dot(" in gradient.ir
    assert gradient.ir.count("dot(") == 1 and "slice(" not in gradient.ir
