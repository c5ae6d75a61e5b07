"""The vertex-centric front ends: ng.zoomIn / ng.zoomOut (seed 000) and ng.saga (seed 003).

`tracing` records per-vertex Python inside `ng.zoomIn` as local-scoped ops; `saga` traces
SAGA-NN's ApplyEdge and ApplyVertex functions as the same program; `lowering` turns them
into whole-graph ops (operation batching) when a computation or a gradient needs them.
"""
from ..errors import TracingError, control_flow_error  # noqa: F401
from .lowering import lower_zoom_outs  # noqa: F401
from .tracing import (LocalAggregate, LocalDegree, LocalFeature, ZoomOut,  # noqa: F401
                      reduce_neighbours, zoomIn, zoomOut)
from .saga import saga  # noqa: F401
