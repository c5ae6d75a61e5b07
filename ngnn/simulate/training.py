"""Predicting what `ngnn bench` measures: a training step and an epoch (the step plus the
evaluation), in one process or over K ranks of a partition, on a topology."""
from .ranks import joint_timeline, rank_trainers, slowdown
from .simulator import predict


class TrainingPrediction:
    """`step_time` and `epoch_time` (seconds); `peak_bytes` (per rank, the memory plans');
    `compute`, `communication`, `waiting` (seconds of a step, the slowest rank's);
    `reports` (the training step's Report per rank); `parts`, `policy`, `topology`,
    `replication_factor` (None in one process)."""

    def __init__(self, step, epoch, parts, policy, topology, reports, split,
                 replication_factor=None):
        self.step_time, self.epoch_time = step, epoch
        self.parts, self.policy, self.topology = parts, policy, topology
        self.reports = reports
        self.peak_bytes = [report.peak_bytes for report in reports]
        self.compute, self.communication, self.waiting = split
        self.replication_factor = replication_factor

    @property
    def label(self):
        where = "1 process" if self.parts == 1 else f"{self.parts} ranks, {self.policy}"
        return f"{where}, {self.topology.name}"

    def trace(self):
        """The ranks' predicted training steps as one Chrome trace (a process per rank)."""
        events = []
        for report in self.reports:
            events += report.trace()["traceEvents"]
        first = self.reports[0].trace()
        first["traceEvents"] = events
        return first

    def write_trace(self, path):
        import json
        from ..files import write_atomically
        return write_atomically(path, json.dumps(self.trace()).encode())


def predict_training(make_trainer, data, topology, parts=1, policy="cvc", trainers=None):
    """A TrainingPrediction of full-graph training. `make_trainer(part, comm)` builds the
    trainer: (None, None) the single-process one, else a DistributedTrainer of a LocalPart
    over a communicator. `trainers`: (trainers, partition or None) built before, to price
    the same computations on another topology."""
    if trainers is None:
        trainers = build_trainers(make_trainer, data, parts, policy)
    built, partition = trainers
    # Ranks on one host share its cache: each prices its tables with its share of it.
    priced = topology.shared_by(parts) if parts > 1 else topology
    steps = [predict(t.train_step, priced, rank=r) for r, t in enumerate(built)]
    evaluations = [predict(t.evaluate_logits, priced, rank=r) for r, t in enumerate(built)]
    if parts == 1:
        step, evaluation = steps[0].step_time, evaluations[0].step_time
        split = (step, 0.0, 0.0)
        return TrainingPrediction(step, step + evaluation, 1, None, topology, steps, split)
    step, compute, communication, waiting = joint_timeline(steps, topology)
    # After the step the ranks add their losses (one all-reduce of a float).
    loss_sum = topology.link(0, 1).allreduce_latency
    step, communication = step + loss_sum, communication + loss_sum
    evaluation = joint_timeline(evaluations, topology)[0]
    return TrainingPrediction(step, step + evaluation, parts, policy, topology, steps,
                              (compute, communication, waiting),
                              partition.replication_factor)


def build_trainers(make_trainer, data, parts, policy):
    """(trainers, partition): one trainer, or one per rank of the partition."""
    if parts == 1:
        return [make_trainer(None, None)], None
    return rank_trainers(make_trainer, data, parts, policy)


__all__ = ["TrainingPrediction", "build_trainers", "predict_training", "slowdown"]
