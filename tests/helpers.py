"""Shared test helpers: running a small graph on NumPy values, and gradient checks against
central finite differences."""
import numpy as np

import ngnn as ng


def check_gradient(build, inputs, make, coords=6, eps=1e-6, rtol=1e-5, atol=1e-7, seed=0):
    """Compare ng.grad of `build(*placeholders)` with central differences.

    `inputs` are float64 arrays, one per placeholder. A non-scalar result is weighed by
    fixed random weights so that every output element contributes differently (a plain sum
    would hide gradients that are wrong by a permutation). Tensors of up to `coords`
    elements are checked at every coordinate, larger ones at `coords` random ones.
    `make` creates the transformer (the `transformer_factory` fixture).
    """
    rng = np.random.default_rng(seed)
    inputs = [np.asarray(v, dtype=np.float64) for v in inputs]
    xs = [ng.placeholder(v.shape, dtype=np.float64, name=f"x{i}") for i, v in enumerate(inputs)]
    y = build(*xs)
    if y.shape:
        weights = ng.constant(rng.uniform(0.5, 1.5, y.shape), dtype=np.float64)
        y = ng.sum(y * weights)
    t = make()
    f = t.computation(y, *xs)
    grads = t.computation(ng.grad(y, xs), *xs)(*inputs)
    for i, (value, g) in enumerate(zip(inputs, grads)):
        assert g.shape == value.shape, f"gradient {i} has shape {g.shape}, not {value.shape}"
        if value.size <= coords:
            points = list(np.ndindex(value.shape))
        else:
            points = [tuple(int(rng.integers(0, s)) for s in value.shape)
                      for _ in range(coords)]
        for idx in points:
            values = []
            for sign in (1.0, -1.0):
                moved = [v.copy() for v in inputs]
                moved[i][idx] += sign * eps
                values.append(float(f(*moved)))
            numeric = (values[0] - values[1]) / (2 * eps)
            tolerance = atol + rtol * max(abs(numeric), 1.0)
            assert abs(g[idx] - numeric) <= tolerance, \
                f"d/dx{i}{list(idx)}: ng.grad gives {g[idx]!r}, finite differences {numeric!r}"


def run(make, build, *inputs, **options):
    """`build(*placeholders)` evaluated on `inputs` by a transformer from `make`; the result
    must come back with the shape and dtype the op declares."""
    inputs = [np.asarray(v) for v in inputs]
    xs = [ng.placeholder(v.shape, dtype=v.dtype, name=f"x{i}") for i, v in enumerate(inputs)]
    y = build(*xs)
    out = make(**options).computation(y, *xs)(*inputs)
    assert out.shape == y.shape and out.dtype == y.dtype, \
        f"got {out.shape} {out.dtype}, the op declares {y.shape} {y.dtype}"
    return out
