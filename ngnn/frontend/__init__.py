"""The vertex-centric front end (seed 000): ng.zoomIn / ng.zoomOut."""
from .errors import TracingError, control_flow_error  # noqa: F401


def lower_zoom_outs(results):
    """Lower vertex-centric regions reachable from `results` to whole-graph ops."""


def reduce_neighbours(values, reduce):
    raise TracingError(f"ng.{reduce} over a list needs a neighbour list inside ng.zoomIn")
