"""ngnn: a compiler for graph neural networks.

    import ngnn as ng
    x = ng.placeholder((4, 3), name="x")
    y = ng.relu(ng.dot(x, w))
"""
from .local_ranks import share_cores

share_cores()                 # before NumPy loads its BLAS (ngnn/local_ranks.py)

from .op_graph import Op, ShapeError
from .op_graph.op import constant, placeholder, variable
from .ops import (abs, aggregate, assign, cast, concat, cross_entropy, dot, dropout,  # noqa: A004
                  edge_softmax, elu, equal, exp, gather, leaky_relu, log, log_softmax, max, maximum,
                  mean, min, minimum, one_hot, relu, reshape, sigmoid, slice, softmax, sqrt,
                  stop_gradient, sum, tanh, transpose)
from .ops import binary_cross_entropy_with_logits, softplus
from .autodiff import grad
from .graph import Graph
from .batch import readout
from .normalization import batch_norm
from .random import manual_seed
from .frontend import TracingError
from .frontend import saga, zoomIn, zoomOut

__version__ = "0.1.0"
