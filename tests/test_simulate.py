"""ngnn.simulate: the topology format, the cost model's invariants, the report and trace,
and the calibrate and simulate commands."""
import json
import re

import numpy as np
import pytest

from ngnn import simulate
from ngnn.cli import _fill_defaults, load_dataset, main, make_parser, make_trainer
from ngnn.op_graph import AllReduce, Placeholder

SBM = ["--dataset", "sbm", "--num-nodes", "300", "--avg-degree", "6", "--num-features", "8",
       "--num-classes", "3"]

# Figures of no machine in particular: the invariants hold for any topology.
DEVICE = {"kind": "cpu", "flops": 1e10, "memory_bandwidth": 1e10, "memory_bytes": 2 ** 33,
          "call_overhead": 1e-6}


def topology():
    return simulate.Topology([simulate.Device(**DEVICE)],
                             [simulate.Link(latency=1e-5, bandwidth=1e9)], name="test")


def trainer_for(model, transformer_factory):
    args = make_parser().parse_args(["bench", "--model", model, *SBM])
    _fill_defaults(args)
    args.backend = "numpy"
    return make_trainer(args, load_dataset(args), 0, transformer=transformer_factory())


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
    # A group costs its members' work plus one call.
    device = topology().device()
    groups = [step for step in comp.steps if not hasattr(step, "args")]
    for group in groups:
        folded = simulate.cost.folded_into_products(group, device)
        members = sum(simulate.cost.work(op, device, topology()).seconds
                      for op in group.ops if op not in folded)
        assert simulate.step_cost(group, device, topology()).seconds == \
            pytest.approx(members + device.call_overhead)
    # Starts follow one another: the NumPy transformer runs its steps in order.
    ends = np.cumsum([step.seconds for step in report.ops])
    assert np.allclose([step.start for step in report.ops[1:]], ends[:-1])


def test_more_edges_cost_more():
    def predicted(degree):
        args = make_parser().parse_args(["bench", "--model", "gcn", "--dataset", "sbm",
                                         "--num-nodes", "300", "--avg-degree", str(degree)])
        _fill_defaults(args)
        from ngnn import transformers as ngt
        trainer = make_trainer(args, load_dataset(args), 0,
                               transformer=ngt.make_transformer("numpy"))
        return simulate.predict(trainer.train_step, topology()).by_kind()["fused"]
    assert predicted(20) > predicted(4)


def test_a_fused_group_is_priced_once():
    from ngnn import transformers as ngt
    args = make_parser().parse_args(["bench", "--model", "gat", *SBM])
    _fill_defaults(args)
    trainer = make_trainer(args, load_dataset(args), 0, transformer=ngt.make_transformer("numpy"))
    comp = trainer.train_step
    report = simulate.predict(comp, topology())
    groups = [step for step in comp.steps if not hasattr(step, "args")]
    assert groups
    fused = [step for step in report.ops if step.kind == "fused"]
    assert sorted(step.name for step in fused) == sorted(group.name for group in groups)
    plain = {step.name for step in report.ops if step.kind != "fused"}
    for group in groups:
        assert not plain & {simulate.simulator.step_name(op) for op in group.core}


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
        rank, size = 0, 4
    x = Placeholder((1000,), np.float32)
    cost = simulate.cost.communication(AllReduce(x, Ranks()), topology(), 0)
    link = topology().link()
    # A ring: 2 (p - 1) messages of a quarter of 4000 bytes each.
    assert cost.comm_bytes == 6 * 1000
    assert cost.seconds == pytest.approx(6 * link.latency + 6000 / link.bandwidth)


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
