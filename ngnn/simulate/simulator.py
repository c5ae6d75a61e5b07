"""predict: walks a computation's plan, the steps the transformer runs in order, and prices
each on the topology's device for this rank.

The NumPy transformer runs its steps one after another on one core, and a rank's
communication blocks it, so the predicted timeline is sequential: each step starts when the
one before ends. Peak memory is the memory plan's figure: the buffers the transformer
allocates are exactly the plan's."""
import json

from ..files import write_atomically
from ..op_graph import Assign
from .cost import is_group, step_cost
from .numpy_plan import NumPyPlan


class StepPrediction:
    """One step of the plan: `name`, `kind`, `start` and `seconds`, and the `flops`,
    `bytes` and `comm_bytes` it was priced from; `ops` the op names it runs."""

    def __init__(self, name, cost, start, ops):
        self.name, self.kind, self.start = name, cost.kind, start
        self.seconds, self.flops, self.bytes = cost.seconds, cost.flops, cost.bytes
        self.comm_bytes, self.ops = cost.comm_bytes, ops

    def __repr__(self):
        return f"<{self.name} {self.kind}: {1e3 * self.seconds:.3f} ms>"


class Report:
    """`step_time` (seconds per call of the computation), `peak_bytes` (the memory plan's),
    `ops` (a StepPrediction per step, in order), `topology`, `device`, `rank`."""

    def __init__(self, name, ops, peak_bytes, topology, device, rank):
        self.name, self.ops, self.peak_bytes = name, ops, peak_bytes
        self.topology, self.device, self.rank = topology, device, rank

    @property
    def step_time(self):
        return sum(step.seconds for step in self.ops)

    def by_kind(self):
        """{kind: seconds}: where the time goes."""
        totals = {}
        for step in self.ops:
            totals[step.kind] = totals.get(step.kind, 0.0) + step.seconds
        return totals

    def trace(self):
        """The predicted timeline as a Chrome trace (chrome://tracing, Perfetto): one
        complete event per step, times in microseconds."""
        events = [{"name": step.name, "cat": step.kind, "ph": "X", "pid": self.rank,
                   "tid": 0, "ts": 1e6 * step.start, "dur": 1e6 * step.seconds,
                   "args": {"flops": step.flops, "bytes": step.bytes,
                            "comm_bytes": step.comm_bytes, "ops": step.ops}}
                  for step in self.ops]
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"computation": self.name, "topology": self.topology.name,
                              "device": self.device.name,
                              "validated": self.topology.validated,
                              "peak_bytes": self.peak_bytes}}

    def write_trace(self, path):
        """Writes the Chrome trace to `path` atomically; returns the path."""
        return write_atomically(path, json.dumps(self.trace()).encode())

    def __repr__(self):
        return (f"<simulate.Report {self.name} on {self.device.name}: "
                f"{1e3 * self.step_time:.3f} ms/step, peak {self.peak_bytes} bytes>")


def step_name(step, names):
    """A step as the IR names it: a group by its name, an op by its value's (`%8`, or the
    user's `%alpha`); `names` is the computation's `value_names`."""
    if is_group(step):
        return step.name or f"kernel {names[step.outputs[0]]}"
    return names[step]


def predict(comp, topology, rank=None):
    """The predicted time, per-step breakdown and peak memory of one call of `comp` (a
    Computation; transformed here if it was not) on `topology`. `rank`: the device it runs
    on; default the computation's own rank in a distributed run, else 0."""
    comp.transform()
    if rank is None:
        rank = _rank_of(comp)
    device = topology.device(rank)
    views = {op for op in comp.ordered_ops if comp.transformer.is_view(op)}
    plan = NumPyPlan(comp) if comp.transformer.name == "numpy" else None
    into = getattr(comp.memory_plan, "into_variable", {})
    ops, clock = [], 0.0
    for step in comp.steps:
        if not is_group(step) and (step.is_leaf or isinstance(step, Assign) and
                                   into.get(step.args[-1]) is step.args[0]):
            continue          # bound, not run; or an update computed in its variable
        cost = step_cost(step, device, topology, rank, views, plan)
        if plan is not None:
            plan.ran(step, cost)
        names = comp.value_names
        members = [step_name(op, names) for op in step.ops] if is_group(step) else \
            [step_name(step, names)]
        ops.append(StepPrediction(step_name(step, names), cost, clock, members))
        clock += cost.seconds
    return Report(comp.name, ops, comp.memory_plan.peak_bytes, topology, device, rank)


def _rank_of(comp):
    for op in comp.ordered_ops:
        exchange = getattr(op, "exchange", None) or \
            getattr(getattr(op, "graph", None), "exchange", None)
        if exchange is not None:
            return exchange.rank
    return 0
