"""The NumPy transformer's block plan (ngnn/passes/block_planning.py): made once by a pass,
before any code is written; the group writer renders it and the simulator prices it."""
import re

import numpy as np

from ngnn import simulate
from ngnn.cli import make_parser
from ngnn.naming import value_identifier
from ngnn.passes import BlockPlan, FusedGroup
from ngnn.recipes import fill_defaults, load_dataset, make_trainer

SBM = ["--dataset", "sbm", "--num-nodes", "300", "--avg-degree", "6", "--num-features", "8",
       "--num-classes", "3"]


def gat_trainer(**options):
    from ngnn import transformers as ngt
    args = make_parser().parse_args(["bench", "--model", "gat", *SBM])
    fill_defaults(args)
    return make_trainer(args, load_dataset(args), 0,
                        transformer=ngt.make_transformer("numpy", **options))


def test_the_plan_is_made_before_the_code_and_the_module_runs_it():
    """After the passes alone (no code yet) every fused group has its block plan; a plan
    changed then is the one the module runs: its block loops hold the plan's edges, its
    sparse products are the plan's (one K.gather_sum each), and the step computes what
    the default plan's does (a vertex's edges never straddle two blocks)."""
    default, changed = gat_trainer(), gat_trainer()
    comp = changed.train_step
    comp.plan()
    assert not comp.transformed         # no code written yet
    plan = comp.block_plan
    assert isinstance(plan, BlockPlan)
    groups = [s for s in comp.steps if isinstance(s, FusedGroup)]
    assert groups and set(plan.groups) == set(groups)
    assert any(blocks.products for blocks in plan.groups.values())
    for blocks in plan.groups.values():
        assert blocks.block_edges > 7
        blocks.block_edges = 7
    source = comp.source
    loops = re.findall(r"K\.blocks\(\w+, '(?:dst|src)', (\d+)\)", source)
    assert loops == ["7"] * len(groups)
    products = sum(len(blocks.products) for blocks in plan.groups.values())
    assert source.count("K.gather_sum(") == products
    for _ in range(2):
        assert np.isclose(changed.step(), default.step(), rtol=1e-5)
    for trainer in (default, changed):
        trainer.transformer.close()


def test_stored_edge_values_in_csr_order_are_read_as_slices():
    """An edge value the plan stores in in-CSR order is read by a destination-parallel
    block as a slice of its CSR, never through edge ids. (GAT's step recomputes every edge
    value by default; with little recomputation allowed it stores some.)"""
    trainer = gat_trainer(max_recompute=1)
    comp = trainer.train_step
    comp.transform()
    plan = comp.block_plan
    assert plan.csr_ordered
    for blocks in plan.groups.values():
        for op in plan.csr_ordered:
            assert blocks.in_csr_slices(op) == (blocks.group.at == "dst")
    for op in plan.csr_ordered:
        identifier = value_identifier(comp.value_names[op])
        assert f"{identifier}[p0:p1]" in comp.source
        assert f"np.take({identifier}, eids" not in comp.source
    trainer.transformer.close()


def test_the_simulator_prices_the_plan_the_module_runs():
    """The simulator reads the computation's own block plan: smaller blocks in the plan,
    more statements priced (each paying the call overhead)."""
    from ngnn.simulate.numpy_plan import NumPyPlan
    topology = simulate.Topology([simulate.Device(
        kind="cpu", flops=1e10, memory_bandwidth=1e10, memory_bytes=2 ** 33,
        call_overhead=1e-6)])
    trainer = gat_trainer()
    comp = trainer.train_step
    comp.transform()
    assert NumPyPlan(comp).groups is comp.block_plan.groups
    before = simulate.predict(comp, topology).by_kind()["fused"]
    for blocks in comp.block_plan.groups.values():
        blocks.block_edges = 7
    after = simulate.predict(comp, topology).by_kind()["fused"]
    assert after > before
    trainer.transformer.close()
