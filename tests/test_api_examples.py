"""The first two code blocks of API.md (the contract), run exactly as written."""
import numpy as np


def test_tensors_ops_gradients_and_computations(capsys):
    # ---- API.md, block 1 (verbatim) ----
    import numpy as np
    import ngnn as ng
    from ngnn import transformers as ngt      # code lives in the top-level transformers/ folder

    x = ng.placeholder((4, 3), dtype=np.float32, name="x")      # fed at call time
    w = ng.variable((3, 2), initial_value=np.ones((3, 2)), name="w")   # state, lives on the device
    c = ng.constant(2.0)
    y = ng.relu(ng.dot(x, w) * c + 1.0)
    loss = ng.sum(y)
    dw = ng.grad(loss, w)                    # also: ng.grad(loss, [w1, w2]) -> list

    np.random.seed(2024)       # block 2 draws its input; the check below draws it again

    # ---- API.md, block 2 (verbatim) ----
    t = ngt.make_transformer("numpy")          # or "gpu"; ngt.transformer_choices() lists what runs here
    comp = t.computation([y, loss], x)         # results first, then the placeholders in call order
    y_val, loss_val = comp(np.random.rand(4, 3).astype(np.float32))   # numpy arrays out
    comp.source                                # the generated program text (Python or CUDA/OpenCL)
    print(comp.ir)                             # the optimized IR, in the SSA text form of the design doc
    t.close()                                  # also usable as `with ngt.make_transformer(...) as t:`

    np.random.seed(2024)
    x_val = np.random.rand(4, 3).astype(np.float32)
    pre = x_val.astype(np.float64) @ np.ones((3, 2)) * 2.0 + 1.0
    expected_y = np.maximum(pre, 0)
    assert isinstance(y_val, np.ndarray) and y_val.dtype == np.float32 and y_val.shape == (4, 2)
    np.testing.assert_allclose(y_val, expected_y, rtol=1e-6)
    np.testing.assert_allclose(loss_val, expected_y.sum(), rtol=1e-6)
    assert capsys.readouterr().out.startswith("graph computation(%x : Float32[4,3]):")

    with ngt.make_transformer("numpy") as t2:
        dw_val = t2.computation(dw, x)(x_val)
    np.testing.assert_allclose(dw_val, x_val.T.astype(np.float64) @ ((pre > 0) * 2.0), rtol=1e-6)
