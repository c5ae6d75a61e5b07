"""Wrong answers, class 1: user names meet the generator's own names. Generated code owns its
namespace (ngnn/naming.py), so any tensor name gives the right answer on every backend."""
import numpy as np
import pytest

import ngnn as ng

SRC, DST = [0, 1, 2, 2, 3], [1, 2, 0, 3, 0]

# Locals of the NumPy fused-group code, module-level names of generated NumPy modules,
# names of generated kernels, C keywords and functions, and prefixes the generator uses.
NAMES = ["src", "dst", "eids", "seg", "v0", "p1", "n_e", "n_v", "g0", "fusedGraph1", "np",
         "K", "scipy", "step", "bind", "buffers", "graphs", "ops", "run", "out", "t_h",
         "b_h", "gid", "in_h", "graph_in_indptr", "acc1", "k1", "lid", "float", "exp",
         "kernel", "return", "None", "1st", "a b", ""]


def reference(h, w):
    out = np.zeros_like(h)
    for e, (s, d) in enumerate(zip(SRC, DST)):
        out[d] += h[s] * w[e]
    return out


@pytest.mark.parametrize("name", NAMES)
def test_an_edge_tensor_named_like_generated_code(transformer_factory, name):
    g = ng.Graph.from_edges(SRC, DST, num_nodes=4)
    h = ng.placeholder((4, 2), name="h")
    w = ng.placeholder((5, 1), name=name)
    with ng.zoomIn(g, node_feat={"h": h}, edge_feat={"w": w}) as v:
        r = sum(n.h * e.w for n, e in zip(v.innbs, v.inedges))
    hv = np.arange(8, dtype=np.float32).reshape(4, 2)
    wv = np.arange(1, 6, dtype=np.float32).reshape(5, 1)
    out = transformer_factory().computation(ng.zoomOut(r), h, w)(hv, wv)
    np.testing.assert_allclose(out, reference(hv, wv), rtol=1e-6)


@pytest.mark.parametrize("name", ["src", "seg", "out", "t_h"])
def test_every_tensor_named_alike(transformer_factory, name):
    """Node tensor, edge tensor, parameter and intermediates all carry the same name."""
    g = ng.Graph.from_edges(SRC, DST, num_nodes=4)
    h = ng.placeholder((4, 2), name=name)
    w = ng.placeholder((5, 1), name=name)
    W = ng.variable((2, 2), initial_value=np.eye(2), name=name)
    with ng.zoomIn(g, node_feat={"h": h}, edge_feat={"w": w}) as v:
        r = ng.relu(sum(n.h * e.w for n, e in zip(v.innbs, v.inedges)))
    out = ng.dot(ng.zoomOut(r), W)
    hv = np.arange(8, dtype=np.float32).reshape(4, 2)
    wv = np.arange(1, 6, dtype=np.float32).reshape(5, 1)
    got = transformer_factory().computation(out, h, w)(hv, wv)
    np.testing.assert_allclose(got, reference(hv, wv), rtol=1e-6)
