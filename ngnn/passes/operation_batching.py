"""OperationBatching (seed 000): per-vertex values traced in ng.zoomIn become whole-graph
node (`n`) and edge (`e`) tensors; edge ops become gathers plus edge-wise ops."""
from .base import GraphPass


class OperationBatching(GraphPass):
    def do_pass(self, computation):
        from ..frontend import lower_zoom_outs
        lower_zoom_outs(computation.results)
