"""The vertex-centric front end (seed 000): ng.zoomIn / ng.zoomOut.

`tracing` records per-vertex Python inside `ng.zoomIn` as local-scoped ops; `lowering`
turns them into whole-graph ops (operation batching) when a computation or a gradient
needs them.
"""
from ..errors import TracingError, control_flow_error  # noqa: F401
from .lowering import lower_zoom_outs  # noqa: F401
from .tracing import (LocalAggregate, LocalDegree, LocalFeature, ZoomOut,  # noqa: F401
                      reduce_neighbours, zoomIn, zoomOut)
