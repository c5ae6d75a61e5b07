"""Measured time per step of a NumPy computation, to hold the predictions against: the
generated `run` function is timed line by line (a trace function on its frame only, so
the code it calls runs untraced), and each line is attributed to the step of the plan
that emitted it (the transformer's ModuleWriter, rendered again with a record of which
lines each step wrote; the rendering must equal the module that runs)."""
import sys
import time

from .cost import is_group


def step_lines(comp):
    """{source line number: step} for the lines of `comp`'s generated `run`."""
    from ngnn.transformers.numpy.transformer import ModuleWriter

    class Recording(ModuleWriter):
        def emit(self, op):
            self._record(op, lambda: ModuleWriter.emit(self, op))

        def emit_group(self, group):
            self._record(group, lambda: ModuleWriter.emit_group(self, group))

        def _record(self, step, write):
            body, deferred = len(self.body), len(self.deferred)
            write()
            self.spans.append((step, range(body, len(self.body)),
                               range(deferred, len(self.deferred))))

    writer = Recording(comp)
    writer.spans = []
    source = writer.render()
    if source != comp._source:
        raise RuntimeError("measure: the transformer's module could not be rendered again "
                           "identically, so its lines cannot be attributed to steps")
    lines = source.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("    def run(")) + 2
    owner = {}
    for step, body, deferred in writer.spans:
        for i in body:
            owner[first + i] = step
        for j in deferred:
            owner[first + len(writer.body) + j] = step
    return owner


def measure_steps(comp, call, repeats=3):
    """{step: seconds} of `comp`'s steps when `call()` runs it (the fastest of `repeats`
    calls for each step: on a shared machine other jobs only ever slow a step down)."""
    owner = step_lines(comp)
    filename = comp.source_file
    best = {}

    def run_lines(frame, event, arg):
        now = time.perf_counter()
        state = run_lines.state
        if state is not None:
            totals[state] = totals.get(state, 0.0) + now - run_lines.start
        run_lines.state = frame.f_lineno if event == "line" else None
        run_lines.start = time.perf_counter()
        return run_lines

    def calls(frame, event, arg):
        if frame.f_code.co_filename == filename and frame.f_code.co_name == "run":
            return run_lines
        return None

    for _ in range(repeats):
        totals = {}
        run_lines.state = None
        sys.settrace(calls)
        try:
            call()
        finally:
            sys.settrace(None)
        per_step = {}
        for line, seconds in totals.items():
            step = owner.get(line)
            if step is not None:
                per_step[step] = per_step.get(step, 0.0) + seconds
        for step, seconds in per_step.items():
            best[step] = min(best.get(step, float("inf")), seconds)
    return {step: seconds for step, seconds in best.items()
            if is_group(step) or not step.is_leaf}
