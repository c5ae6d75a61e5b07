"""The op-graph: op classes under their CamelCase names (`Add`, `Exp`, `Dot`, ...)."""
from .op import (Attr, Op, Leaf, Placeholder, Variable, Constant, ShapeError, SparseInputError,
                 UndeclaredAttributeError, ordered_ops, placeholder, variable, constant, as_ops)
from .elementwise import (ElementWise, UnaryOp, BinaryOp, Add, Subtract, Multiply, Divide,
                          Power, Maximum, Minimum, Comparison, Greater, GreaterEqual, LessEqual,
                          Equal, Negative, Exp, Log, Sqrt, Tanh, Sigmoid, Relu, Abs, Sign,
                          LeakyRelu, Elu, Softplus, Cast, StopGradient, unbroadcast, zeros)
from .reductions import Reduction, Sum, Mean, Max, Min, Softmax, LogSoftmax
from .layout import LayoutOp, Reshape, Transpose, Broadcast, Concat, Slice, Unslice
from .linalg import Dot, ZeroRowDot
from .graph_ops import GraphOp, Gather, Aggregate, EdgeSoftmax
from .training_ops import Dropout, OneHot, Assign, seed_dropout
from .sparse import SparseDot, SparseDropout, SparseTransposedDot
from .communication import (Communication, MirrorReduce, MasterBroadcast, AllReduce,
                            ReadoutAllReduce, PackedCollective)
from .normalization import (BatchNormStats, BatchNormStatsGrad, BatchNormApply,
                            BatchNormApplyGrad, BatchNormApplySums)
