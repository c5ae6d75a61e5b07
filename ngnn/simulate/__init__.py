"""Predict before you run (seed 001, DistIR): a cost model and simulator for ngnn
computations. `predict(comp, topology)` walks the plan the transformer runs and prices
each step on a `Topology` (calibrated here by `ngnn calibrate`, or a preset)."""
from .calibration import calibrate, default_profile_path, measure
from .cost import Cost, step_cost
from .simulator import Report, StepPrediction, predict
from .topology import Curve, Device, Link, Topology, preset
from .training import TrainingPrediction, build_trainers, predict_training
from . import topology

__all__ = ["Cost", "Curve", "Device", "Link", "Report", "StepPrediction", "Topology",
           "TrainingPrediction", "build_trainers", "calibrate", "default_profile_path",
           "measure", "predict", "predict_training", "preset", "step_cost", "topology"]
