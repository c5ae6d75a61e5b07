"""OperationBatching (seed 000): per-vertex values traced in ng.zoomIn become whole-graph
node (`n`) and edge (`e`) tensors; edge ops become gathers plus edge-wise ops.

This pass is how a computation lowers traced code: the first of every transformer's graph
passes. The lowering itself (ngnn.frontend.lowering) is also run, before any computation
exists, by what works on whole-graph ops only: ng.grad, the distributed communication
rewrite, and the trainers' check that a model takes sparse features."""
from ..frontend import lower_zoom_outs
from .base import GraphPass


class OperationBatching(GraphPass):
    def do_pass(self, computation):
        lower_zoom_outs(computation.results)
