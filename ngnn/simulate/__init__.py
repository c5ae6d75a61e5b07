"""Predict before you run (seed 001, DistIR): a cost model and simulator for ngnn
computations. `predict(comp, topology)` walks the plan the transformer runs and prices
each step on a `Topology` (calibrated here by `ngnn calibrate`, or a preset)."""
from .calibration import calibrate, default_profile_path, measure
from .cost import Cost, step_cost
from .simulator import Report, StepPrediction, predict
from .topology import Device, Link, Topology, preset

__all__ = ["Cost", "Device", "Link", "Report", "StepPrediction", "Topology", "calibrate",
           "default_profile_path", "measure", "predict", "preset", "step_cost"]
