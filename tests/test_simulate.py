"""ngnn.simulate: the topology format, the cost model's invariants, the report and trace,
and the calibrate and simulate commands."""
import functools
import json
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import ngnn as ng
from ngnn import simulate
from ngnn.cli import main, make_parser
from ngnn.recipes import fill_defaults, load_dataset, make_trainer
from ngnn.distributed.exchange import LONGEST_PAUSE, YIELD_FOR
from ngnn.op_graph import Aggregate, AllReduce, Placeholder

SBM = ["--dataset", "sbm", "--num-nodes", "300", "--avg-degree", "6", "--num-features", "8",
       "--num-classes", "3"]

# Figures of no machine in particular: the invariants hold for any topology.
DEVICE = {"kind": "cpu", "flops": 1e10, "memory_bandwidth": 1e10, "memory_bytes": 2 ** 33,
          "call_overhead": 1e-6}


def topology():
    return simulate.Topology([simulate.Device(**DEVICE)],
                             [simulate.Link(latency=1e-5, bandwidth=1e9)], name="test")


def trainer_for(model, transformer_factory, *options):
    args = make_parser().parse_args(["bench", "--model", model, *SBM, *options])
    fill_defaults(args)
    args.backend = "numpy"
    return make_trainer(args, load_dataset(args), 0, transformer=transformer_factory())


def fused_seconds(model, **device):
    """The predicted fused groups' time of `model` on SBM on a device of DEVICE's figures
    and `device`'s fields, and its training step."""
    from ngnn import transformers as ngt
    trainer = trainer_for(model, lambda: ngt.make_transformer("numpy"))
    topology = simulate.Topology([simulate.Device(**DEVICE, **device)])
    seconds = simulate.predict(trainer.train_step, topology).by_kind()["fused"]
    trainer.transformer.close()
    return seconds, trainer.train_step


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_peak_bytes_equal_the_memory_plan(model, transformer_factory):
    trainer = trainer_for(model, transformer_factory)
    for comp in (trainer.train_step, trainer.evaluate_logits):
        report = simulate.predict(comp, topology())
        assert report.peak_bytes == comp.memory_plan.peak_bytes > 0


@pytest.mark.parametrize("model", ["gcn", "gat", "sage"])
def test_costs_are_positive_and_add_up(model, transformer_factory):
    trainer = trainer_for(model, transformer_factory)
    comp = trainer.train_step
    report = simulate.predict(comp, topology())
    assert report.ops and all(step.seconds > 0 for step in report.ops)
    assert report.step_time == pytest.approx(sum(step.seconds for step in report.ops))
    assert sum(report.by_kind().values()) == pytest.approx(report.step_time)
    # A GPU kernel group costs its members' work plus one launch.
    device = topology().device()
    for group in (step for step in comp.steps if type(step).__name__ == "KernelGroup"):
        members = sum(simulate.cost.work(op, device, topology()).seconds for op in group.ops)
        assert simulate.step_cost(group, device, topology()).seconds == \
            pytest.approx(members + device.call_overhead)
    # Starts follow one another: the NumPy transformer runs its steps in order.
    ends = np.cumsum([step.seconds for step in report.ops])
    assert np.allclose([step.start for step in report.ops[1:]], ends[:-1])


def test_a_numpy_group_pays_per_block():
    """Smaller blocks: the same work in more statements, each paying the call overhead."""
    from ngnn import transformers as ngt
    args = make_parser().parse_args(["bench", "--model", "gat", *SBM])
    fill_defaults(args)
    costs = []
    for block_bytes in (8 << 20, 2048):
        transformer = ngt.make_transformer("numpy", fusion_block_bytes=block_bytes)
        trainer = make_trainer(args, load_dataset(args), 0, transformer=transformer)
        report = simulate.predict(trainer.train_step, topology())
        costs.append(report.by_kind()["fused"])
        transformer.close()
    assert costs[1] > costs[0]


def test_more_edges_cost_more():
    def predicted(degree):
        args = make_parser().parse_args(["bench", "--model", "gcn", "--dataset", "sbm",
                                         "--num-nodes", "300", "--avg-degree", str(degree)])
        fill_defaults(args)
        from ngnn import transformers as ngt
        trainer = make_trainer(args, load_dataset(args), 0,
                               transformer=ngt.make_transformer("numpy"))
        return simulate.predict(trainer.train_step, topology()).by_kind()["fused"]
    assert predicted(20) > predicted(4)


def test_a_fused_group_is_priced_once():
    from ngnn import transformers as ngt
    args = make_parser().parse_args(["bench", "--model", "gat", *SBM])
    fill_defaults(args)
    trainer = make_trainer(args, load_dataset(args), 0, transformer=ngt.make_transformer("numpy"))
    comp = trainer.train_step
    report = simulate.predict(comp, topology())
    groups = [step for step in comp.steps if not hasattr(step, "args")]
    assert groups
    fused = [step for step in report.ops if step.kind == "fused"]
    assert sorted(step.name for step in fused) == sorted(group.name for group in groups)
    plain = {step.name for step in report.ops if step.kind != "fused"}
    for group in groups:
        assert not plain & {simulate.simulator.step_name(op, comp.value_names)
                          for op in group.core}


def test_the_trace_is_chrome_json_with_one_event_per_step(tmp_path, transformer_factory):
    trainer = trainer_for("gcn", transformer_factory)
    report = simulate.predict(trainer.train_step, topology())
    path = report.write_trace(tmp_path / "trace.json")
    trace = json.loads(open(path).read())
    events = trace["traceEvents"]
    assert len(events) == len(report.ops)
    assert all(e["ph"] == "X" and e["dur"] > 0 for e in events)
    assert [e["name"] for e in events] == [step.name for step in report.ops]
    assert trace["otherData"]["peak_bytes"] == report.peak_bytes
    assert not list(tmp_path.glob("*.tmp"))


def test_all_reduce_follows_the_alpha_beta_model():
    class Ranks:
        rank, size = 0, 2
    x = Placeholder((1000,), np.float32)
    device = topology().device()
    cost = simulate.cost.work(AllReduce(x, Ranks()), device, topology(), 0)
    link = topology().link()
    assert cost.comm_bytes == 4000
    assert cost.seconds == pytest.approx(link.allreduce_latency + 4000 / link.allreduce_bandwidth)
    Ranks.size = 1
    assert simulate.cost.work(AllReduce(x, Ranks()), device, topology(), 0).seconds == 0


def test_curves_interpolate_between_measured_points():
    curve = simulate.Curve([1e3, 1e5], [1, 4, 16], [[1.0, 2.0, 4.0], [2.0, 4.0, 8.0]])
    assert curve(4, 1e3) == pytest.approx(2.0) and curve(16, 1e5) == pytest.approx(8.0)
    assert curve(2, 1e3) == pytest.approx(2 ** 0.5)            # log-linear in width
    assert curve(4, 1e4) == pytest.approx(8 ** 0.5)            # and in table rows
    assert curve(4, 10) == pytest.approx(2.0) and curve(4, 1e9) == pytest.approx(4.0)
    assert curve(64, 1e3) == pytest.approx(16.0)               # past the widest: per element
    with pytest.raises(ValueError, match="rows and widths must be increasing"):
        simulate.Curve([2, 1], [1], [[1.0], [1.0]])
    with pytest.raises(ValueError, match="seconds must be 1 rows of 2 figures"):
        simulate.Curve([1], [1, 2], [[1.0]])


def test_topology_round_trips_through_json(tmp_path):
    original = simulate.Topology(
        [simulate.Device(name="a", **DEVICE), simulate.Device(name="b", **DEVICE)],
        [simulate.Link(1e-6, 5e10, ends=("a", "b")), simulate.Link(1e-5, 1e9)], name="two")
    path = tmp_path / "two.json"
    original.save(path)
    loaded = simulate.Topology.load(path)
    assert loaded.to_dict() == original.to_dict()
    assert loaded.link(0, 1).bandwidth == 5e10
    assert loaded.link(0, 5).bandwidth == 5e10      # ranks past the list reuse the last
    assert loaded.link(1, 5).bandwidth == 1e9       # b to b: the default link


def test_topology_loads_yaml(tmp_path):
    yaml = pytest.importorskip("yaml")
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(topology().to_dict()))
    assert simulate.Topology.load(path).to_dict() == topology().to_dict()


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("devices"), "missing field 'devices'"),
    (lambda d: d["devices"][0].pop("flops"), r"devices\[0\] is missing field\(s\) flops"),
    (lambda d: d["devices"][0].update(memory_bandwidth=-1.0),
     "memory_bandwidth must be a finite number > 0"),
    (lambda d: d["links"][0].update(bandwidth=-5), "bandwidth must be a finite number > 0"),
    (lambda d: d["links"][0].pop("latency"), r"links\[0\] is missing field\(s\) latency"),
    (lambda d: d["devices"][0].update(speed=1), r"unknown field\(s\) speed"),
    (lambda d: d["devices"][0].update(flops="fast"), "flops must be a finite number"),
    (lambda d: d["links"][0].update(ends=["x", "y"]), "link end 'x' is no device"),
])
def test_bad_topology_files_get_clear_errors(tmp_path, change, message):
    data = topology().to_dict()
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        simulate.Topology.load(path)


def test_a_file_that_is_not_json_names_itself(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{devices: ")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        simulate.Topology.load(path)


def test_presets_are_unvalidated():
    for name in ("h100", "a100"):
        assert simulate.preset(name).validated is False
    with pytest.raises(ValueError, match="no topology preset 'tpu'"):
        simulate.preset("tpu")


BENCH_SHAPE = (r"(\w+) on ([\w-]+), numpy, predicted on (.+): (\d+\.\d) ms/epoch "
               r"\(training step (\d+\.\d) ms\), peak intermediate memory (\d+\.\d) MiB")


def test_calibrate_and_simulate_commands(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    assert main(["calibrate", "--quick", "--out", str(profile)]) == 0
    assert f"profile written to {profile}" in capsys.readouterr().out
    measured = simulate.Topology.load(profile).device()
    assert measured.flops > 0 and measured.call_overhead > 0 and measured.dropout_rate > 0
    trace = tmp_path / "trace.json"
    assert main(["simulate", "--model", "gcn", *SBM, "--topology", str(profile),
                 "--trace", str(trace)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-2]
    match = re.fullmatch(BENCH_SHAPE, line)
    assert match and match.group(1) == "gcn" and float(match.group(5)) > 0
    assert json.loads(trace.read_text())["traceEvents"]
    # The fused groups' primitives are also timed inside busy blocks, the out-CSR's too;
    # rows of stored edge values from tables EDGES_PER_ROW times the node tables.
    for name in ("take_busy", "out_take_busy", "take_sorted_busy", "segment_busy",
                 "segment_sum_busy", "spmm_busy", "out_spmm_busy", "gather_sum_heads",
                 "out_gather_sum_heads", "gather_sum_heads_short",
                 "out_gather_sum_heads_short", "edge_take_busy", "keep_take_busy", "segment_sum",
                 "take_sorted", "spmm_warm", "spmm_touch", "out_spmm_touch", "take_touch",
                 "out_take_touch", "np.add@bias"):
        assert min(min(row) for row in measured.curves[name].seconds) > 0, name
    assert "out_segment_busy" not in measured.curves
    edges_per_row = simulate.calibration.EDGES_PER_ROW
    for name in ("edge_take_busy", "keep_take_busy"):
        assert measured.curves[name].rows == \
            [edges_per_row * rows for rows in measured.curves["take_busy"].rows]


def test_simulate_on_a_preset_says_unvalidated(tmp_path, capsys):
    path = tmp_path / "h100.json"
    simulate.preset("h100").save(path)
    assert main(["simulate", "--model", "gat", *SBM, "--topology", str(path)]) == 0
    assert "unvalidated profile" in capsys.readouterr().out


def test_simulate_without_a_profile_says_what_to_do(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NGNN_CACHE_DIR", str(tmp_path))
    assert main(["simulate", "--model", "gcn", *SBM]) == 1
    assert "run `ngnn calibrate` first" in capsys.readouterr().err


def test_calibrate_writes_the_default_profile(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NGNN_CACHE_DIR", str(tmp_path))
    assert main(["calibrate", "--quick"]) == 0
    assert (tmp_path / "profile.json").exists()
    assert main(["simulate", "--model", "sage", *SBM]) == 0
    assert re.search(BENCH_SHAPE, capsys.readouterr().out)


def test_calibrate_without_mpi4py_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mpi4py", None)          # import mpi4py fails
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "mpi4py is not installed" in out and "MPI not measured" in out


def test_calibrate_measures_two_mpi_ranks():
    pytest.importorskip("mpi4py")
    measured, why = simulate.calibration.measure_mpi(quick=True)
    assert why is None, why
    assert measured["latency"] > 0 and measured["bandwidth"] > 0
    assert measured["allreduce_latency"] > 0 and measured["contention"] >= 1


def quick_profile(tmp_path_factory, cache={}):
    if "topology" not in cache:
        path = tmp_path_factory.mktemp("profile") / "profile.json"
        cache["topology"] = simulate.calibrate(str(path), quick=True, mpi=False)[0]
    return cache["topology"]


def test_every_step_run_is_priced_and_every_priced_step_runs(tmp_path_factory):
    """The prediction prices exactly the steps the transformer runs, each with a positive
    time. How near each price is to its measured time is a benchmark's figure
    (benchmarks/bench_simulate_ops.py, docs/simulator.md), never a test's: a timed bound
    fails on a loaded machine (test_a_fused_groups_price_follows_its_counts checks the
    counts and units deterministically)."""
    from ngnn import transformers as ngt
    from ngnn.simulate.measure import measure_steps
    topology_ = quick_profile(tmp_path_factory)
    for model in ("gcn", "gat"):
        args = make_parser().parse_args(["bench", "--model", model, "--dataset", "rmat",
                                         "--num-nodes", "5000"])
        fill_defaults(args)
        trainer = make_trainer(args, load_dataset(args), 0,
                               transformer=ngt.make_transformer("numpy"))
        trainer.step()
        report = simulate.predict(trainer.train_step, topology_)
        measured = measure_steps(trainer.train_step, lambda: trainer.step(False), repeats=1)
        predicted = {step.name: step.seconds for step in report.ops}
        names = trainer.train_step.value_names
        assert {simulate.simulator.step_name(s, names) for s in measured} == set(predicted)
        assert all(seconds > 0 for seconds in predicted.values())
        assert any(not hasattr(s, "args") for s in measured)       # fused groups ran
        trainer.transformer.close()


@pytest.mark.parametrize("model", ["gcn", "gat", "sage", "gin"])
def test_a_fused_groups_price_follows_its_counts(model):
    """On a device without a per-call cost, every fused group of a graph 4 times larger
    (R-MAT, same degree) costs 4 times as much (3.5 to 4.5: blocks round), and each costs
    between 1 and 10,000 times reading 4 bytes per edge at the memory bandwidth. A term
    priced on the wrong count (per call, per weight, squared) breaks the first; one in the
    wrong unit (ms or ns for s) the second. Deterministic, unlike a comparison with
    measured times (the benchmarks'), which this replaced."""
    from ngnn import transformers as ngt
    topology_ = simulate.Topology([simulate.Device(**{**DEVICE, "call_overhead": 0.0})])

    def fused(num_nodes):
        args = make_parser().parse_args(["bench", "--model", model, "--dataset", "rmat",
                                         "--num-nodes", str(num_nodes)])
        fill_defaults(args)
        data = load_dataset(args)
        trainer = make_trainer(args, data, 0, transformer=ngt.make_transformer("numpy"))
        report = simulate.predict(trainer.train_step, topology_)
        trainer.transformer.close()
        return ({step.name: step.seconds for step in report.ops if step.kind == "fused"},
                data.graph.num_edges)

    small, small_edges = fused(2000)
    large, large_edges = fused(8000)
    assert small and set(small) == set(large)
    assert large_edges == 4 * small_edges
    edge_read = 4 * small_edges / DEVICE["memory_bandwidth"]
    for name, seconds in small.items():
        assert 3.5 <= large[name] / seconds <= 4.5, name
        assert 1 <= seconds / edge_read <= 1e4, name


def test_ranks_are_predicted_from_their_own_computations(tmp_path_factory):
    """Two ranks of a cvc partition, built as mpiexec would build them (no MPI started):
    each rank's peak is its memory plan's, and the step waits at every exchange."""
    pytest.importorskip("mpi4py")
    from ngnn import transformers as ngt
    args = make_parser().parse_args(["bench", "--model", "gcn", *SBM])
    fill_defaults(args)
    data = load_dataset(args)

    def build(part, comm):
        args.part = part
        return make_trainer(args, data, 0, comm=comm, transformer=ngt.make_transformer("numpy"))

    prediction = simulate.predict_training(build, data, topology(), parts=2, policy="cvc")
    trainers = [r for r in prediction.reports]
    assert len(trainers) == 2 and prediction.replication_factor > 1
    built, _ = simulate.build_trainers(build, data, 2, "cvc")
    assert prediction.peak_bytes == [t.train_step.memory_plan.peak_bytes for t in built]
    exchanges = [[s for s in report.ops if s.kind == "comm"] for report in prediction.reports]
    assert len(exchanges[0]) == len(exchanges[1]) > 0
    assert prediction.communication > 0
    assert prediction.step_time >= max(r.step_time - sum(s.seconds for s in e)
                                       for r, e in zip(prediction.reports, exchanges))
    one = simulate.predict_training(build, data, topology(), parts=1)
    assert one.peak_bytes == [built[0].train_step.memory_plan.peak_bytes] or \
        len(one.peak_bytes) == 1


def test_joint_timeline_meets_at_each_exchange():
    from ngnn.simulate.ranks import joint_timeline

    class Step:
        def __init__(self, kind, seconds):
            self.kind, self.seconds = kind, seconds

    class Report:
        def __init__(self, steps):
            self.ops = [Step(k, s) for k, s in steps]
    fast = Report([("dense", 1.0), ("comm", 0.5), ("dense", 1.0)])
    slow = Report([("dense", 3.0), ("comm", 0.25), ("dense", 1.0)])
    total, compute, communication, waiting = joint_timeline([fast, slow], topology())
    # The fast rank notices the exchange's end at its next poll, at most a pause late.
    assert 3.0 + 0.5 + 1.0 <= total <= 3.0 + 0.5 + 1.0 + LONGEST_PAUSE
    assert (compute, communication) == pytest.approx((4.0, 0.5))
    assert waiting == pytest.approx(total - 4.5)
    with pytest.raises(ValueError, match="differ in their communication ops"):
        joint_timeline([fast, Report([("dense", 1.0)])], topology())


def test_a_waiting_rank_wakes_at_its_next_poll():
    """exchange.wait's schedule: polls between yields for YIELD_FOR (noticed at once), then
    after pauses of 10 us doubling up to 1 ms, each overrun by the calibrated slack."""
    from ngnn.simulate.ranks import woken
    assert woken(0.0, 7e-5) == 0.0
    assert woken(5e-6, 7e-5) == 5e-6
    assert woken(YIELD_FOR + 5e-6, 0.0) == pytest.approx(YIELD_FOR + 1e-5)
    assert woken(YIELD_FOR + 1e-4, 7e-5) == pytest.approx(YIELD_FOR + 8e-5 + 9e-5)
    late = woken(1.0, 0.0)
    assert 1.0 <= late <= 1.0 + LONGEST_PAUSE


def test_what_ifs_are_ranked(tmp_path, capsys):
    pytest.importorskip("mpi4py")
    profile = tmp_path / "profile.json"
    topology().save(profile)
    assert main(["simulate", "--model", "gcn", *SBM, "--parts", "1", "2", "--partition",
                 "cvc", "oec", "--topology", str(profile), "h100"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 6                      # (1 process + 2 ranks x 2 policies) x 2
    times = [float(line.split("|")[3]) for line in rows]
    assert times == sorted(times)
    assert sum("(unvalidated)" in line for line in rows) == 3
    assert "2 ranks (oec)" in out and "replication factor" in out


def test_the_best_of_calibrations_keeps_each_best_figure():
    def profile(flops, overhead, seconds, latency):
        device = simulate.Device(**{**DEVICE, "flops": flops, "call_overhead": overhead},
                                 curves={"take": simulate.Curve([1], [1, 4], [seconds])})
        return simulate.Topology([device], [simulate.Link(latency, 1e9)], name="p")
    best = simulate.calibration.best_of(profile(1e10, 2e-6, [3.0, 1.0], 1e-5),
                                        profile(2e10, 3e-6, [2.0, 5.0], 2e-5))
    device = best.device()
    assert device.flops == 2e10 and device.call_overhead == 2e-6
    assert device.curves["take"].seconds == [[2.0, 1.0]]
    assert best.link().latency == 1e-5


def test_a_block_with_edge_arrays_reads_the_busy_curves():
    """A group whose blocks make more than one edge array prices its primitives by the
    curves measured in busy blocks; a group of sparse products alone (GCN's) by those
    measured alone; either curve stands in where only it was measured."""
    from ngnn import transformers as ngt
    from ngnn.simulate.numpy_plan import Block, NumPyPlan
    alone = simulate.Curve([1], [1], [[1.0]])
    busy = simulate.Curve([1], [1], [[3.0]])
    device = simulate.Device(**DEVICE, curves={"take": alone, "take_busy": busy,
                                               "spmm_busy": busy})
    assert simulate.cost.blocked(device, "take", 10, 1, 1, 1).seconds == 10
    assert simulate.cost.blocked(device, "take", 10, 1, 1, 1, busy=True).seconds == 30
    assert simulate.cost.blocked(device, "spmm", 10, 1, 1, 1).seconds == 30
    busy_groups = {}
    for model in ("gcn", "gat"):
        args = make_parser().parse_args(["bench", "--model", model, *SBM])
        fill_defaults(args)
        transformer = ngt.make_transformer("numpy")
        trainer = make_trainer(args, load_dataset(args), 0, transformer=transformer)
        trainer.train_step.transform()
        plan = NumPyPlan(trainer.train_step)
        flags = []
        for group_plan in plan.groups.values():
            flags.append(Block(plan, group_plan, device, 1, group_plan.skipped).busy)
        busy_groups[model] = flags
        transformer.close()
    assert busy_groups["gcn"] and not any(busy_groups["gcn"])
    assert any(busy_groups["gat"])


def test_a_light_busy_block_reads_its_tables_steady_plus_their_first_reads():
    """A busy block reading no rows by edge ids (no stored edge values, no edge dropout's
    mask) keeps its node tables from block to block: its random reads cost the light
    block's second pass ("_light_steady") plus the first reads of the rows it touches
    ("_light_touch", calibration.first_reads); a block reading by edge ids, "_busy"."""
    from ngnn import transformers as ngt
    from ngnn.simulate.calibration import first_reads
    from ngnn.simulate.numpy_plan import Block, NumPyPlan
    curves = {"take" + suffix: simulate.Curve([1], [1], [[value]]) for suffix, value in (
        ("_busy", 5e-9), ("_light", 4e-9), ("_light_steady", 1e-9), ("_light_touch", 2e-9))}
    device = simulate.Device(**DEVICE, curves=curves)
    kinds = set()
    # GAT's groups read its attention dropout's mask by edge ids; without dropout, none.
    for dropout in ("0.6", "0"):
        transformer = ngt.make_transformer("numpy")
        trainer = trainer_for("gat", lambda: transformer, "--dropout", dropout)
        trainer.train_step.transform()
        plan = NumPyPlan(trainer.train_step)
        transformer.close()
        for group_plan in plan.groups.values():
            block = Block(plan, group_plan, device, 1, set())
            if not block.busy:
                continue
            kinds.add(block.light)
            edges = 1000
            expected = 1e-9 * edges + 2e-9 * first_reads(block.touched, edges) \
                if block.light else 5e-9 * edges
            assert block.blocked("take", edges, 1, 100, 1).seconds == pytest.approx(expected)
    assert kinds == {True, False}


def test_a_per_head_product_is_priced_by_the_length_of_its_blocks():
    """An attention group's per-head product costs what calibration measured in blocks
    as long as its own: the busy blocks' figure in blocks of busy_block_edges, the short
    blocks' in blocks SHORT_BLOCKS times shorter, log-linear between and held outside."""
    from ngnn import transformers as ngt
    from ngnn.simulate.calibration import SHORT_BLOCKS, busy_block_edges
    from ngnn.simulate.numpy_plan import Block, NumPyPlan
    long_, short = simulate.Curve([1], [8], [[1e-9]]), simulate.Curve([1], [8], [[4e-9]])
    device = simulate.Device(**DEVICE, curves={"gather_sum_heads": long_,
                                               "out_gather_sum_heads": long_,
                                               "gather_sum_heads_short": short,
                                               "out_gather_sum_heads_short": short})
    transformer = ngt.make_transformer("numpy")
    trainer = trainer_for("gat", lambda: transformer)
    trainer.train_step.transform()
    plan = NumPyPlan(trainer.train_step)
    group_plan = next(iter(plan.groups.values()))
    transformer.close()
    width, blocks = 8, 4
    longest = busy_block_edges(width)
    per_edge = {}
    for edges_per_block in (4 * longest, longest, longest / SHORT_BLOCKS ** 0.5,
                            longest / SHORT_BLOCKS, longest / SHORT_BLOCKS / 4):
        block = Block(plan, group_plan, device, blocks, set())
        edges = edges_per_block * blocks
        per_edge[edges_per_block] = block.heads_product(edges, 8, width, 100).seconds / \
            (8 * edges)
    assert list(per_edge.values()) == pytest.approx([1e-9, 1e-9, 2e-9, 4e-9, 4e-9])


def test_a_broadcast_multiply_is_priced_at_its_row_length():
    """NumPy's inner loop over a trailing broadcast is one row: a value times rows of 16
    costs less an element than times rows of 4 (the calibrated curve across row lengths;
    past the widest, its widest), and a profile measured at one row length reads that."""
    by_row = simulate.Curve([1], [4, 16], [[2e-9, 1e-9]])
    one_row = simulate.Curve([1], [1], [[3e-9]])
    plain = simulate.Curve([1], [1], [[1e-12]])
    per_element = {}
    for label, trailing in (("by row", by_row), ("one row", one_row)):
        device = simulate.Device(**DEVICE, curves={"np.multiply": plain,
                                                   "np.multiply@trailing": trailing})
        for width in (4, 16, 64):
            x = ng.placeholder((100, width), np.float32)
            op = x * ng.placeholder((100, 1), np.float32)
            per_element[label, width] = simulate.cost.elementwise(op, device).seconds / \
                (100 * width)
    assert per_element["by row", 4] == pytest.approx(2e-9)
    assert per_element["by row", 16] == pytest.approx(1e-9)
    assert per_element["by row", 64] == pytest.approx(1e-9)
    assert all(per_element["one row", w] == pytest.approx(3e-9) for w in (4, 16, 64))


def test_a_bias_added_to_each_row_is_priced_at_its_row_length():
    """One row repeated along the others (a bias) also makes NumPy's inner loop a row: at
    its own calibrated curve, or a profile without one, at the trailing broadcast's."""
    by_row = simulate.Curve([1], [4, 16], [[2e-9, 1e-9]])
    bias = simulate.Curve([1], [4, 16], [[3e-9, 1e-9]])
    plain = simulate.Curve([1], [1], [[1e-12]])
    x = ng.placeholder((100, 4), np.float32)
    for curves, per_bias in (({"np.multiply@trailing": by_row}, 2e-9),
                             ({"np.multiply@trailing": by_row, "np.add@bias": bias}, 3e-9)):
        device = simulate.Device(**DEVICE, curves={"np.add": plain, "np.multiply": plain,
                                                   **curves})
        for other, per_element in ((ng.placeholder((4,), np.float32), per_bias),
                                   (ng.placeholder((100, 4), np.float32), 1e-12)):
            seconds = simulate.cost.elementwise(x + other, device).seconds
            assert seconds == pytest.approx(per_element * 400)
    times_column = x * ng.placeholder((100, 1), np.float32)
    assert simulate.cost.elementwise(times_column, device).seconds == pytest.approx(2e-9 * 400)


def test_a_cold_table_costs_its_warm_reads_and_the_first_reads_of_its_rows():
    """Where calibration measured the first reads of rows ("_touch"), a quiet group reads
    a table not in the cache at its warm cost per edge plus those of the rows it touches
    (the vertices with edges at the other end; calibration.first_reads of them and the
    edges), whatever the cold curve says (it was measured on a sample that touches more
    rows per edge than a whole graph)."""
    from ngnn.passes import FusedGroup
    seconds = {}
    for cold, touch in ((4e-9, 1e-9), (4e-9, 5e-9), (9e-9, 5e-9)):
        curves = {name + suffix: simulate.Curve([1], [1, 1024], [[value, value]])
                  for name in ("spmm", "out_spmm")
                  for suffix, value in (("", cold), ("_warm", 1e-9), ("_touch", touch))}
        seconds[cold, touch], step = fused_seconds("gcn", curves=curves)
    touched = 0
    for group in (s for s in step.steps if isinstance(s, FusedGroup)):
        other = group.graph.out_indptr if group.at == "dst" else group.graph.in_indptr
        products = sum(isinstance(op, Aggregate) for op in group.ops)
        touched += products * np.sqrt(np.count_nonzero(np.diff(other)) *
                                      group.graph.num_edges)
    assert touched > 0
    assert seconds[4e-9, 5e-9] - seconds[4e-9, 1e-9] == pytest.approx(4e-9 * touched,
                                                                      rel=1e-6)
    assert seconds[9e-9, 5e-9] == pytest.approx(seconds[4e-9, 5e-9], rel=1e-9)


def test_calibration_prepares_each_key_right_before_timing_it():
    """A primitive timed cold has the cache flushed, a warm one its table written, right
    before each of its timings (not before the round)."""
    calls = []
    simulate.calibration._fastest({key: functools.partial(calls.append, key)
                                   for key in ("a", "b")}, 2,
                                  before={"b": functools.partial(calls.append, "before b")})
    assert calls == ["a", "before b", "b"] * 3


def test_calibration_times_a_blocks_statements_warm_and_its_tables_cold(monkeypatch):
    """What a fused block computes and reads at once (its statements, the segment ids from
    the bounds it just sliced) is timed after a call of its own; the tables its ids read
    at random, after a cache flush, and again after a write ("_warm")."""
    class Prepared(Exception):
        pass

    def record(timings, rounds, before, warm_up=True):
        raise Prepared(timings, before)

    monkeypatch.setattr(simulate.calibration, "_fastest", record)
    with pytest.raises(Prepared) as caught:
        simulate.calibration.measure(quick=True)
    timings, before = caught.value.args
    assert before["repeat_rate"] is timings["repeat_rate"]
    small = simulate.calibration.FUNCTION_SIZES[True][0]
    assert before["np.add", small, 1] is timings["np.add", small, 1]
    rows, width = simulate.calibration.graph_sizes(True)[1][0], 4
    assert before["spmm", rows, width] is simulate.calibration.flush_cache
    assert before["spmm_warm", rows, width].func is np.multiply


def test_busy_blocks_time_every_configuration_once_a_round(monkeypatch):
    """The busy block loops (the table's "busy" rows) run round by round over every table
    size, CSR and width (a busy moment of a shared machine slows one round of each, not
    all rounds of one): with the reads by edge ids where a configuration has them
    ("_busy"), without them ("_light"), and without them again, the tables as the first
    pass left them ("_light_steady"). Each statement keeps its fastest round; a light
    block's first reads ("_light_touch") are its two passes' difference per
    calibration.first_reads."""
    calibration = simulate.calibration
    runs = []

    def run_busy(K, x, heads, weight, stored, keep, **blocks):
        runs.append((x.shape, blocks["segments"], stored is not None))
        return np.full(len(calibration.BUSY_STATEMENTS), (1e4 - len(runs)) / 1e6)

    monkeypatch.setattr(calibration, "_run_busy", run_busy)
    rows = [row for row in calibration.SAMPLES if row.name in ("busy", "out_busy")]
    best, _ = calibration.per_item(rows, calibration.Bench(True), 3)
    per_round = len(runs) // calibration.BUSY_ROUNDS
    assert runs == runs[:per_round] * calibration.BUSY_ROUNDS
    _, tables, edges = calibration.graph_sizes(True)
    in_csr = ((tables[0], 1), True)
    last = len(runs) - per_round + runs[:per_round].index(in_csr + (True,))
    assert runs[last:last + 3] == [in_csr + (True,), in_csr + (False,), in_csr + (False,)]
    seconds = [(1e4 - i) / 1e6 for i in range(last + 1, last + 4)]  # the last round's
    indptr, cols = calibration.rmat_block(tables[0], edges, seed=1)
    key = (tables[0], 1)
    for name, expected in zip(("take_busy", "take_light", "take_light_steady"), seconds):
        assert best[(name,) + key] == pytest.approx(expected / len(cols))
    assert best[("take_light_touch",) + key] == pytest.approx(
        (seconds[1] - seconds[2]) / calibration.first_reads(len(np.unique(cols)), len(cols)))


def test_a_table_is_warm_for_its_share_written_in_the_last_cache_bytes_streamed():
    """A step writes its outputs evenly through the bytes it moves; an LRU cache holds the
    last `cache_bytes` streamed."""
    from ngnn.simulate.cost import Cost
    from ngnn.simulate.numpy_plan import NumPyPlan
    plan = NumPyPlan.__new__(NumPyPlan)
    plan.streamed, plan.written, plan.is_view = 0.0, {}, lambda op: False
    device = simulate.Device(**DEVICE, cache_bytes=100)
    table, other = object(), object()
    plan.ran(SimpleNamespace(outputs=[table]), Cost(nbytes=200))     # a step of a group
    assert plan.warm(table, device) == pytest.approx(0.5)
    plan.ran(SimpleNamespace(outputs=[other]), Cost(nbytes=50))
    assert plan.warm(table, device) == pytest.approx(0.25)
    plan.ran(SimpleNamespace(outputs=[other]), Cost(nbytes=100))
    assert plan.warm(table, device) == 0.0
    assert plan.warm(other, device) == 1.0 and plan.warm(object(), device) == 0.0
    assert plan.warm(other, simulate.Device(**DEVICE)) == 0.0


def test_a_table_written_shortly_before_is_read_warm():
    """A quiet group reads a table at its warm cost when less than the device's share of
    the cache has streamed past since the table was written (an LRU cache), else at its
    cold cost; a device without a cache size never reads warm (nor, nearly, one of a
    byte)."""
    cold, warm = simulate.Curve([1], [1], [[4e-9]]), simulate.Curve([1], [1], [[1e-9]])
    curves = {name + suffix: curve for name in ("spmm", "out_spmm")
              for suffix, curve in (("", cold), ("_warm", warm))}
    fused = {cache: fused_seconds("gcn", curves=curves, cache_bytes=cache)[0]
             for cache in (None, 1, 2 ** 40)}
    assert fused[None] == pytest.approx(fused[1], rel=1e-3) and fused[1] > fused[2 ** 40]


def test_segment_sums_and_stored_edge_values_have_their_own_curves():
    """A segment sum reads the sum's curve (NumPy's add reduces faster than its maximum);
    rows of stored edge values read from a table between the node tables' and the edge
    tables' calibrated sizes cost between the two, log-linearly in the rows."""
    take = simulate.Curve([100, 500], [1], [[1.0], [2.0]])
    edge_take = simulate.Curve([1000, 5000], [1], [[4.0], [8.0]])
    segment, segment_sum = (simulate.Curve([1], [1], [[v]]) for v in (2.0, 1.0))
    device = simulate.Device(**DEVICE, curves={"take": take, "edge_take": edge_take,
                                               "segment": segment,
                                               "segment_sum": segment_sum})
    assert simulate.cost.segment_curve(device, "sum") == "segment_sum"
    assert simulate.cost.segment_curve(device, "mean") == "segment_sum"
    assert simulate.cost.segment_curve(device, "max") == "segment"
    per_item = simulate.cost.per_item
    assert per_item(device, "edge_take", 1, 100) == pytest.approx(1.0)
    assert per_item(device, "edge_take", 1, 5000) == pytest.approx(8.0)
    between = [per_item(device, "edge_take", 1, rows) for rows in (500, 600, 800, 1000)]
    assert between[0] == pytest.approx(2.0) and between[-1] == pytest.approx(4.0)
    assert between == sorted(between)


def test_a_narrower_product_never_costs_more_than_a_wider_one():
    capped = simulate.calibration.monotone([[9.0, 1.0, 3.0], [2.0, 5.0, 4.0]])
    assert capped == [[1.0, 1.0, 3.0], [2.0, 4.0, 4.0]]


def two_ranks(model="gcn"):
    from ngnn import transformers as ngt
    args = make_parser().parse_args(["bench", "--model", model, *SBM])
    fill_defaults(args)
    data = load_dataset(args)

    def build(part, comm):
        args.part = part
        return make_trainer(args, data, 0, comm=comm, transformer=ngt.make_transformer("numpy"))
    return simulate.build_trainers(build, data, 2, "cvc")[0]


def test_exchanges_are_priced_by_the_rows_they_move():
    """A reduction restricted to copies with local edges at one end sends only their rows,
    and each rank receives exactly what its peer sends (the peer's flags, as
    Exchange.restricted learns them)."""
    pytest.importorskip("mpi4py")
    from ngnn.op_graph import MirrorReduce
    from ngnn.simulate.cost import exchange_rows
    trainers = two_ranks()
    restricted = []
    for trainer in trainers:
        trainer.train_step.transform()
        restricted.append([op for op in trainer.train_step.ordered_ops
                           if isinstance(op, MirrorReduce) and op.at is not None])
    assert len(restricted[0]) == len(restricted[1]) > 0
    for ops in zip(*restricted):
        (mirrors0, masters0), (mirrors1, masters1) = [exchange_rows(op.graph, op.at)
                                                      for op in ops]
        assert masters0[1] == mirrors1[0] and masters1[0] == mirrors0[1]
        local = ops[0].graph
        everyone = len(local.exchange.mirrors_from[1])
        assert mirrors0[1] == int(local.active(ops[0].at)[local.exchange.mirrors_from[1]]
                                  .sum()) <= everyone


def test_a_dropout_keyed_by_ids_draws_their_span():
    """kernels.dropout_rows draws the mask over the span of the ids (a rank's global ids):
    ids spread over twice their count cost more than consecutive ones; the kernels keep a
    scattered mask for the step, so the backward dropout of the same mask only picks its
    rows (ids spread over more than SPARSE_ROWS times their count) or reads them."""
    from ngnn.op_graph import Dropout
    from ngnn.simulate.cost import dropout, keep_bits
    device = simulate.Device(**DEVICE)

    class Ids:
        pass
    x = Placeholder((1000, 16), np.float32)

    def keyed(ids, seed=7):
        graph = Ids()
        graph.ids = np.asarray(ids)
        return Dropout(x, 0.5, seed=seed, rows=(graph, "ids"))
    consecutive = dropout(keyed(np.arange(1000)), device, {}).seconds
    assert dropout(keyed(np.arange(0, 2000, 2)), device, {}).seconds > consecutive
    masks = {}
    first = keep_bits(device, keyed(np.arange(0, 10000, 10)), masks).seconds
    assert keep_bits(device, keyed(np.arange(0, 10000, 10)), masks).seconds < first / 5
    assert keep_bits(device, keyed(np.arange(0, 10000, 10), seed=8), masks).seconds == \
        pytest.approx(first)
    # Denser scattered ids: the kernels keep their mask for the step too.
    graph = Ids()
    graph.ids = np.arange(0, 2000, 2)
    dense = Dropout(x, 0.5, seed=9, rows=(graph, "ids"))
    assert keep_bits(device, dense, masks).seconds > 0
    assert keep_bits(device, dense, masks).seconds == 0


def test_ranks_on_one_host_share_its_cache():
    """Two ranks on a host read tables at random as with half the cache each: a table of
    R rows costs what 2 R rows cost alone; a product's curve (by its inner size) and an
    element-wise function's are unchanged."""
    take = simulate.Curve([100, 1000], [1, 4], [[1.0, 2.0], [3.0, 6.0]])
    device = simulate.Device(**DEVICE, cores=2, curves={"take": take, "matmul": take,
                                                        "out_spmm_busy": take,
                                                        "np.exp": take})
    host = simulate.Topology([device], [simulate.Link(1e-5, 1e9)])
    shared = host.shared_by(2).device()
    assert shared.curves["take"](1, 100) == pytest.approx(take(1, 200))
    assert shared.curves["out_spmm_busy"](1, 100) == pytest.approx(take(1, 200))
    assert shared.curves["matmul"](1, 100) == shared.curves["np.exp"](1, 100) == take(1, 100)
    assert host.shared_by(8).device().curves["take"](4, 50) == pytest.approx(take(4, 100))
    assert host.device().curves["take"] is take
    gpus = simulate.Topology([simulate.Device(**DEVICE, curves={"take": take})])
    assert gpus.shared_by(2).device().curves["take"] is take


def test_the_median_of_many_calibrations_takes_each_middle_figure():
    def profile(flops, seconds, contention):
        device = simulate.Device(**{**DEVICE, "flops": flops},
                                 curves={"take": simulate.Curve([1], [1, 4], [seconds])})
        return simulate.Topology([device], [simulate.Link(1e-5, 1e9, contention=contention)])
    typical = simulate.calibration.median_of(profile(1e10, [3.0, 1.0], 1.0),
                                             profile(3e10, [2.0, 5.0], 1.2),
                                             profile(2e10, [1.0, 2.0], 1.1))
    assert typical.device().flops == 2e10
    assert typical.device().curves["take"].seconds == [[2.0, 2.0]]
    assert typical.link().contention == pytest.approx(1.1)


def test_an_edge_dropout_takes_its_mask_rows_at_the_calibrated_cost_of_bytes():
    """A fused edge dropout takes its block's mask rows by edge ids: a byte a head, at
    the keep_take curve (per row, by the bytes a row holds)."""
    from ngnn.op_graph import Dropout
    from ngnn.passes import FusedGroup
    a, b = (simulate.Curve([1], [1], [[seconds]]) for seconds in (1e-9, 3e-9))
    cheap, step = fused_seconds("gat", curves={"keep_take_busy": a})
    dear, _ = fused_seconds("gat", curves={"keep_take_busy": b})
    taken = [op for group in step.steps if isinstance(group, FusedGroup)
             for op in group.ops if isinstance(op, Dropout) and op.scope == "e"]
    assert taken
    rows = sum(op.shape[0] * int(np.prod(op.shape[1:])) for op in taken)
    assert dear - cheap == pytest.approx(2e-9 * rows)


def test_a_mean_divides_each_row_by_one_degree_at_the_row_length_cost():
    """A fused mean aggregation (K.divide_by_degrees) divides each row by one value:
    priced per element at the trailing broadcast's curve at the row's length."""
    from ngnn.op_graph import Aggregate
    from ngnn.passes import FusedGroup
    plain = simulate.Curve([1], [1], [[1e-12]])
    seconds = {}
    for per_element in (1e-9, 4e-9):
        seconds[per_element], step = fused_seconds("sage", curves={
            "np.divide": plain, "np.multiply": plain,
            "np.multiply@trailing": simulate.Curve([1], [1], [[per_element]])})
    means = [op for group in step.steps if isinstance(group, FusedGroup)
             for op in group.ops if isinstance(op, Aggregate) and op.reduce == "mean"]
    assert means
    elements = sum(int(np.prod(op.shape)) for op in means)
    assert seconds[4e-9] - seconds[1e-9] == pytest.approx(3e-9 * elements, rel=1e-6)


def test_an_element_wise_op_is_priced_by_the_numpy_functions_it_declares():
    """Each NumPy function an op declares (`numpy_calls`) costs its calibrated curve per
    element; an op declaring a function the profile lacks is priced as a pass over its
    operands per function, at the memory bandwidth."""
    x = ng.placeholder((100, 4), np.float32)
    curves = {name: simulate.Curve([1], [1], [[seconds]]) for name, seconds in (
        ("np.exp", 1e-9), ("np.copyto", 2e-9), ("np.expm1", 4e-9), ("np.greater", 8e-9))}
    device = simulate.Device(**DEVICE, curves=curves)
    elu = ng.elu(x)
    assert type(elu).numpy_calls == ("np.copyto", "np.expm1", "np.greater")
    assert simulate.cost.elementwise(ng.exp(x), device).seconds == pytest.approx(400e-9)
    assert simulate.cost.elementwise(elu, device).seconds == pytest.approx(400 * 14e-9)
    log = ng.log(x)
    assert simulate.cost.elementwise(log, device).seconds == pytest.approx(
        2 * 1600 / DEVICE["memory_bandwidth"] + 400 / device.transcendental_rate)


def test_calibration_times_every_numpy_function_the_ops_declare(monkeypatch):
    """Element-wise ops are priced by the NumPy functions they declare, so calibration
    times exactly those (and a mask's cast), at each function size: a new op's function is
    measured without naming it in calibration."""
    from ngnn.op_graph import Elu, Exp, Softplus

    class Timed(Exception):
        pass

    def record(timings, rounds, before, warm_up=True):
        raise Timed(timings)

    monkeypatch.setattr(simulate.calibration, "_fastest", record)
    with pytest.raises(Timed) as caught:
        simulate.calibration.measure(quick=True)
    timed = {key[0] for key in caught.value.args[0]
             if key[-1] == 1 and key[0].startswith(("np.", "scipy."))}
    declared = set(Exp.numpy_calls + Elu.numpy_calls + Softplus.numpy_calls)
    assert declared <= timed
    assert timed == set(simulate.calibration.declared_functions()) | {"np.multiply@cast"}


def test_a_kind_of_sample_is_one_row_of_the_calibration_table(monkeypatch):
    """A new kernel to calibrate is a row: its call on the data at a point, the points,
    the cache state and the fit; the generic routines time it (cold, and warm as
    "_warm"), divide by its items and fit its curve, and calibration times it with the
    others."""
    calibration = simulate.calibration

    def segment_min(g):
        return calibration.Timing(
            lambda: [g.K.segment_reduce(g.edge_rows[p0:p1], g.indptr[v0:v1 + 1] - p0, "min",
                                        g.out[v0:v1]) for v0, v1, p0, p1 in g.blocks],
            g.edges, g.edge_rows)
    row = calibration.Sample("segment_min", calibration.first_table,
                             calibration.on_graph(segment_min, seed=2), "cold+warm")
    figures, rates = calibration.per_item([row], calibration.Bench(True), 1)
    widths, tables, _ = calibration.graph_sizes(True)
    assert set(figures) == {(name, tables[0], w) for name in ("segment_min", "segment_min_warm")
                            for w in widths}
    assert all(seconds > 0 for seconds in figures.values()) and rates == {}
    assert list(calibration.fit_curves(figures)["segment_min"].widths) == list(widths)

    class Timed(Exception):
        pass

    def record(timings, rounds, before, warm_up=True):
        raise Timed(timings, before)

    monkeypatch.setattr(calibration, "SAMPLES", calibration.SAMPLES + (row,))
    monkeypatch.setattr(calibration, "_fastest", record)
    with pytest.raises(Timed) as caught:
        calibration.measure(quick=True)
    timings, before = caught.value.args
    assert ("segment_min", tables[0], widths[0]) in timings
    assert before["segment_min", tables[0], widths[0]] is calibration.flush_cache


def test_an_op_is_priced_by_the_work_it_declares():
    """The simulator asks the op: an op declaring the kernels its statement runs
    (`Op.work`) is priced as those kernels, with nothing about it in the simulator."""
    from ngnn.op_graph import Op
    from ngnn.op_graph.work import Work

    class Lookup(Op):
        work = (Work("take", 1000, 4, 500), Work("pass", 4000, moved=32000, calls=2))

        def __init__(self, x):
            super().__init__([x], shape=(1000, 4), dtype=np.float32)
    device = simulate.Device(**DEVICE, curves={"take": simulate.Curve([500], [4], [[2e-9]])})
    cost = simulate.cost.work(Lookup(Placeholder((500, 4), np.float32)), device, topology())
    assert cost.seconds == pytest.approx(1000 * 2e-9 + 32000 / DEVICE["memory_bandwidth"])
    assert (cost.calls, cost.bytes) == (3, 1000 * 16 + 32000)
