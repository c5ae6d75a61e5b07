"""The `ngnn` command: train, datasets, show-ir, bench, partition.

    ngnn train --model gat --dataset cora --runs 5
    mpiexec -n 2 ngnn train --model gcn --dataset cora --partition cvc
    ngnn datasets
    ngnn show-ir --model gcn --dataset cora
    ngnn show-ir --model gat --dataset cora --format png --out gat.png
    ngnn bench --model gcn --dataset cora --epochs 20
    ngnn profile --model gat --dataset cora --backend gpu
"""
import argparse
import os
import sys
import time

import numpy as np

from ngnn.recipes import (GRAPH_MODELS, MODELS, SPARSE_CHOICES, SYNTHETIC, fill_defaults,
                          graph_batch_size, load_dataset, make_graph_trainer,
                          make_link_trainer, make_trainer, run_transformer)


def dataset_choices():
    from ngnn import datasets
    return datasets.names() + list(SYNTHETIC)


def fanout_list(text):
    """"15,10" -> [15, 10]; -1 stands for every in-edge."""
    try:
        fanouts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints such as 15,10, got "
                                         f"{text!r}") from None
    if any(f < 1 and f != -1 for f in fanouts):
        raise argparse.ArgumentTypeError(f"fanouts must be positive or -1 (every in-edge), "
                                         f"got {text!r}")
    return fanouts


def distributed(args):
    return getattr(args, "partition", None) or getattr(args, "partition_dir", None)


def _is_root(args):
    """Rank 0 of a distributed run, or a single process: the one that writes files."""
    return getattr(args, "part", None) is None or args.part.rank == 0


def attach_part(args, data):
    """Under --partition / --partition-dir: this rank's part, and a line describing it."""
    from ngnn.distributed import launch
    if getattr(args, "batch_size", None) or getattr(args, "eval_fanouts", None):
        raise ValueError("distributed training is full-graph: --partition and "
                         "--partition-dir do not combine with --batch-size or --eval-fanouts")
    args.part = launch.local_part(data, args.partition, args.partition_dir)
    print(launch.describe(args.part))


# ---- subcommands -------------------------------------------------------------------------

def cmd_train(args):
    task = getattr(args, "task", "node")
    if task == "link":
        return cmd_train_link(args)
    refuse_link_options(args)
    if task == "graph" or args.dataset in graph_dataset_choices():
        return cmd_train_graph(args)
    data = load_dataset(args)
    print(data.summary())
    if distributed(args):
        attach_part(args, data)
    print(args.recipe)
    print(f"backend {args.backend}" +
          (f", minibatches of {args.batch_size or 512} with fanouts "
           f"{args.fanouts or 'all'}" if args.batch_size or args.fanouts else ""))
    if args.plot:
        from ngnn import plots
        plots.format_of(args.plot)       # a bad file name fails now, not after training
    vals, tests, epoch_times, histories = [], [], [], []
    for run in range(args.runs):
        seed = args.seed + run
        trainer = make_trainer(args, data, seed)
        try:
            history = trainer.fit(args.epochs, patience=args.patience,
                                  progress=not args.no_progress and _is_root(args))
            per_epoch = trainer.time_per_epoch() if len(history) > 1 else None
            if distributed(args):
                from ngnn.distributed.launch import per_epoch as communication
                print(communication(trainer, len(history)))
            if getattr(args, "memory_budget", None):
                print(chunking(trainer.train_step))
            result = trainer.evaluate()
            if args.save and _is_root(args):
                trainer.save(_run_path(args.save, run, args.runs))
        finally:
            trainer.transformer.close()
        histories.append(history)
        vals.append(100 * result["val"])
        tests.append(100 * result["test"])
        timing = ""
        if per_epoch is not None:
            epoch_times.append(per_epoch)
            timing = f", {1000 * per_epoch:.1f} ms/epoch"
        print(f"run {run + 1}/{args.runs} (seed {seed}): val {vals[-1]:.1f}, "
              f"test {tests[-1]:.1f}, {len(history)} epochs{timing}", flush=True)
    if epoch_times:
        print(f"time per epoch: {1000 * np.mean(epoch_times):.1f} ms "
              f"(training step + evaluation, first epoch excluded)")
    print(f"val accuracy: {np.mean(vals):.1f} ± {np.std(vals):.1f}")
    print(f"test accuracy: {np.mean(tests):.1f} ± {np.std(tests):.1f} ({args.runs} runs)")
    if args.plot and _is_root(args):
        plots.training_curves(histories, args.plot, title=f"{args.model} on {data.name}")
        print(f"training curves written to {args.plot}")
    return 0


# ---- graph classification (ngnn/graph_train.py) -----------------------------------------

def graph_dataset_choices():
    from ngnn import datasets
    return datasets.graph_names()


def cmd_train_graph(args):
    """`ngnn train --task graph`: k-fold cross-validation of a graph classifier, the GIN
    paper's protocol (ngnn/graph_train.py); the last line is the accuracy, mean ± std over
    folds at the epoch where the mean is best. Under `mpiexec -n K` every batch trains
    over the K ranks (DistributedGraphLoaderTrainer), printing what one process prints."""
    from ngnn import datasets
    from ngnn.graph_train import cross_validate, summarize
    if distributed(args):
        raise ValueError("--partition and --partition-dir partition the graph of node "
                         "classification; graph classification partitions each batch "
                         "itself: start it under mpiexec -n K without them")
    if args.task != "graph" or args.dataset not in graph_dataset_choices():
        raise ValueError(f"{args.dataset} is a {'graph' if args.task == 'node' else 'node'}-"
                         f"classification dataset; --task {args.task} needs one of "
                         + ", ".join(graph_dataset_choices() if args.task == "graph"
                                     else datasets.names()))
    if args.model not in GRAPH_MODELS:
        raise ValueError(f"--task graph trains {' or '.join(GRAPH_MODELS)}, not {args.model}")
    data = datasets.load(args.dataset)
    print(data.summary())
    folds = data.cross_validation(args.folds, seed=args.seed)
    source = "DGCNN's published folds" if data.folds is not None and \
        args.folds == len(data.folds) else f"stratified folds drawn with seed {args.seed}"
    batch_size = graph_batch_size(args)
    print(f"model {args.model} (graph): hidden {args.hidden}, dropout {args.dropout}, lr "
          f"{args.lr} times {args.lr_gamma} every {args.lr_step} epochs, weight decay "
          f"{args.weight_decay}, {args.epochs} epochs, batches of {batch_size} graphs, "
          f"{args.folds}-fold cross-validation ({source}), backend {args.backend}")
    ranks, comm = graph_ranks(args), None
    if ranks > 1:
        from ngnn.distributed import world
        check_graph_ranks(args, folds, batch_size, ranks)
        comm = world()
    transformer = run_transformer(args)      # chunked under --memory-budget, slot and all
    try:
        trainer = make_graph_trainer(args, data, transformer, comm)
        if comm is not None:
            masters, rows, edges = trainer.loader.slot_sizes()
            print(f"over {ranks} ranks: each batch partitioned by vertex ranges, a rank's "
                  f"slot {masters} master rows, {rows} local rows, {edges} edges")
        curves = cross_validate(trainer, folds, args.epochs, progress=not args.no_progress
                                and (comm is None or comm.Get_rank() == 0))
        if comm is not None:
            from ngnn.distributed.launch import epoch_line
            print(epoch_line(trainer.exchange.totals(), len(folds) * args.epochs))
        if getattr(args, "memory_budget", None):
            print(chunking(trainer.train_step))
    finally:
        transformer.close()
    for k, curve in enumerate(curves):
        print(f"fold {k + 1}/{len(folds)}: test {100 * curve[-1]:.1f} after the last epoch, "
              f"best {100 * curve.max():.1f}")
    best, mean, std = summarize(curves)
    print(f"best mean epoch: {best + 1} of {args.epochs}; last epoch: "
          f"{100 * curves[:, -1].mean():.1f} ± {100 * curves[:, -1].std():.1f}")
    print(f"test accuracy: {mean:.1f} ± {std:.1f} ({len(folds)} folds)")
    return 0


def graph_ranks(args):
    """The ranks `ngnn train --task graph` trains over: mpiexec's count, 1 without it."""
    if args.command != "train" or getattr(args, "task", None) != "graph":
        return 1
    from ngnn.distributed.launch import launched_ranks
    return launched_ranks()


def check_graph_ranks(args, folds, batch_size, ranks):
    """Refuses, on every rank alike, what graph classification over ranks does not run."""
    if getattr(args, "memory_budget", None):
        raise ValueError(f"--memory-budget does not combine with training over {ranks} "
                         "ranks: chunked execution does not split a step whose ops "
                         "communicate between ranks; run one process or leave it out")
    if batch_size < ranks:
        raise ValueError(f"batches of {batch_size} graphs over {ranks} ranks: every batch "
                         f"needs at least as many graphs as ranks; give --batch-size "
                         f"{ranks} or more, or start fewer ranks")
    for k, (train, test) in enumerate(folds):
        for name, ids in (("training", train), ("test", test)):
            last = len(ids) % batch_size
            if 0 < last < ranks:
                raise ValueError(f"fold {k + 1}'s {len(ids)} {name} graphs in batches of "
                                 f"{batch_size} leave a last batch of {last}, fewer graphs "
                                 f"than the {ranks} ranks; choose another --batch-size or "
                                 "--folds, or start fewer ranks")


def _add_task_options(parser):
    parser.add_argument("--task", choices=("node", "graph", "link"), default="node",
                        help="node: classify a graph's vertices; graph: classify whole graphs "
                        "(TU datasets: mutag, proteins, nci1, imdb_binary, ...); link: "
                        "predict held-out edges (test AUC and AP)")
    task = parser.add_argument_group("graph classification (--task graph)")
    task.add_argument("--folds", type=integer(2), default=10,
                      help="cross-validation folds of --task graph (default 10)")
    task.add_argument("--lr-step", type=integer(1),
                      help="epochs between learning-rate decays (default 50, the GIN paper's)")
    task.add_argument("--lr-gamma", type=real(0.0, low_open=True),
                      help="factor of each learning-rate decay (default 0.5, the GIN paper's; "
                      "1 keeps the rate constant)")


def _run_path(path, run, runs):
    if runs == 1:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.run{run + 1}{ext or '.npz'}"


# ---- link prediction (--task link) -----------------------------------------------------------

LINK_ONLY = ("latent", "decoder", "neg_ratio", "split_seed")
# Options of node classification that link training does not take.
NOT_FOR_LINKS = ("patience", "save", "plot", "batch_size", "fanouts", "eval_fanouts",
                 "partition", "partition_dir")


def refuse_link_options(args):
    given = [key for key in LINK_ONLY if getattr(args, key, None) is not None]
    if given:
        raise ValueError(f"--{given[0].replace('_', '-')} is an option of link prediction; "
                         "add --task link")


def cmd_train_link(args):
    from ngnn import datasets
    given = [key for key in NOT_FOR_LINKS if getattr(args, key, None)]
    if given:
        raise ValueError(f"--task link does not take --{given[0].replace('_', '-')} (link "
                         "training is full-graph, with the weights of the best validation AUC)")
    data = load_dataset(args)
    print(data.summary())
    split = datasets.link_split(data, val=0.05, test=0.1, seed=args.split_seed)
    print(split.summary())
    print(f"model {args.model} encoder: hidden {args.hidden}" +
          (f" x {args.heads} heads" if args.model == "gat" else "") +
          f", latent {args.latent}, {args.decoder} decoder, dropout {args.dropout}, lr "
          f"{args.lr}, weight decay {args.weight_decay}, {args.epochs} epochs, "
          f"negatives per link {args.neg_ratio:g}, "
          f"{'normalized' if args.normalize_features else 'raw'} features, backend "
          f"{args.backend}")
    results, epoch_times = {"val": [], "test": []}, []
    for run in range(args.runs):
        seed = args.seed + run
        transformer = run_transformer(args)
        try:
            trainer = make_link_trainer(args, data, split, seed, transformer)
            history = trainer.fit(args.epochs, progress=not args.no_progress)
            per_epoch = trainer.time_per_epoch() if len(history) > 1 else None
            result = trainer.evaluate()
        finally:
            transformer.close()
        for name in results:
            results[name].append([100 * result[name]["auc"], 100 * result[name]["ap"]])
        timing = ""
        if per_epoch is not None:
            epoch_times.append(per_epoch)
            timing = f", {1000 * per_epoch:.1f} ms/epoch"
        (val_auc, val_ap), (test_auc, test_ap) = results["val"][-1], results["test"][-1]
        print(f"run {run + 1}/{args.runs} (seed {seed}): val AUC {val_auc:.1f} AP {val_ap:.1f},"
              f" test AUC {test_auc:.1f} AP {test_ap:.1f}, MRR "
              f"{100 * result['test']['mrr']:.1f}, Hits@50 "
              f"{100 * result['test'].get('hits@50', float('nan')):.1f}{timing}", flush=True)
    if epoch_times:
        print(f"time per epoch: {1000 * np.mean(epoch_times):.1f} ms "
              f"(training step + validation, first epoch excluded)")
    for name in ("val", "test"):
        (auc, ap), (auc_std, ap_std) = np.mean(results[name], 0), np.std(results[name], 0)
        print(f"{name} AUC: {auc:.1f} ± {auc_std:.1f}, AP: {ap:.1f} ± {ap_std:.1f}" +
              (f" ({args.runs} runs)" if name == "test" else ""))
    return 0


def _add_link_options(parser):
    group = parser.add_argument_group("link prediction (--task link)")
    group.add_argument("--latent", type=integer(1),
                       help="features of the node embeddings the decoder scores (default 16)")
    group.add_argument("--decoder", choices=("dot", "mlp"),
                       help="score a pair by the embeddings' dot product (default), or by an "
                       "MLP over their element-wise product")
    group.add_argument("--neg-ratio", type=real(0.0),
                       help="negative pairs per training link, drawn anew each epoch "
                       "(default 1)")
    group.add_argument("--split-seed", type=integer(0),
                       help="seed of the link split (5%% validation, 10%% test links; "
                       "default 0)")


def cmd_datasets(args):
    from ngnn import datasets
    from ngnn.datasets.embedded import DATA_DIR
    header = ("name", "nodes", "edges", "features", "classes", "train", "val", "test")
    rows = []
    for name, sizes in datasets.info().items():
        # Masks only: loading coauthor_cs in full would read half a gigabyte of features.
        with np.load(os.path.join(DATA_DIR, name + ".npz"), allow_pickle=False) as archive:
            if "edge_type" in archive.files:    # RDF: the training set validates too
                train, test = archive["train_idx"].size, archive["test_idx"].size
                splits = [train, train, test]
            else:
                splits = [int(archive[key].sum())
                          for key in ("train_mask", "val_mask", "test_mask")]
        rows.append((name, sizes["nodes"], sizes["edges"], sizes["features"], sizes["classes"],
                     *splits))
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths))))
    return 0


def cmd_show_ir(args):
    if args.out is None and (args.format or args.collapse or args.forward or args.layer):
        print("ngnn show-ir: --format, --collapse, --forward and --layer draw a picture; "
              "give its file with --out", file=sys.stderr)
        return 2
    if args.out is not None:
        from ngnn.op_graph import picture
        picture.format_of(args.out, args.format)   # a bad name fails before compiling
    data = load_dataset(args)
    trainer = make_trainer(args, data, args.seed)
    comp = trainer.train_step if args.computation == "train" else trainer.evaluate_logits
    comp.transform()
    if args.out is not None:
        try:
            return _draw_ir(args, trainer, comp)
        finally:
            trainer.transformer.close()
    history = comp.ir_history
    if args.only:
        names = [name for name, _ in history]
        if args.only not in names:
            print(f"ngnn show-ir: no pass named {args.only!r}; passes run: "
                  f"{', '.join(names)}", file=sys.stderr)
            return 2
        history = [(name, text) for name, text in history if name == args.only]
    for name, text in history:
        print(f"==== IR after {name} ====")
        print(text)
        print()
    trainer.transformer.close()
    return 0


def _draw_ir(args, trainer, comp):
    passes = [name for name, _ in comp.ir_snapshots]
    if args.only and args.only not in passes:
        print(f"ngnn show-ir: no pass named {args.only!r}; passes run: {', '.join(passes)}",
              file=sys.stderr)
        return 2
    layer = None
    if args.layer:
        layers = dict(trainer.model.layers)
        if args.layer not in layers:
            print(f"ngnn show-ir: model {args.model} has no layer {args.layer!r}; its layers: "
                  f"{', '.join(layers)}", file=sys.stderr)
            return 2
        layer = layers[args.layer].parameters()
    path = comp.draw(args.out, after=args.only, format=args.format, collapse=args.collapse,
                     forward=args.forward, layer=layer)
    groups = len(comp.snapshot(args.only).groups)
    print(f"IR of {comp.name} after {args.only or passes[-1]} ({groups} fused groups) "
          f"drawn to {path}")
    return 0


def cmd_bench(args):
    from ngnn import transformers as ngt
    data = load_dataset(args)
    print(data.summary())
    if args.plot:
        from ngnn import plots
        plots.format_of(args.plot)
    backends = [args.backend] if args.backend else ngt.transformer_choices()
    if distributed(args):
        attach_part(args, data)
        backends = [args.backend or "numpy"]
    # Each configuration is a backend with fusion on, and with --unfused also off.
    configurations = [(backend, fusion) for backend in backends
                      for fusion in ((True, False) if args.unfused else (True,))]
    rows = []
    for backend, fusion in configurations:
        args.backend = backend
        label = backend if fusion else f"{backend}, no fusion"
        trainer = make_trainer(args, data, args.seed,
                               transformer=ngt.make_transformer(backend, fusion=fusion))
        start = time.perf_counter()
        trainer.step()
        trainer.predict()
        first = time.perf_counter() - start
        if distributed(args):
            before = trainer.communication()
        trainer.fit(args.epochs, progress=False)
        per_epoch = trainer.time_per_epoch()
        step = np.mean([record["step_time"] for record in trainer.history[1:]])
        peak = trainer.train_step.memory_plan.peak_bytes
        trainer.transformer.close()
        rows.append({"label": label, "ms_per_epoch": 1000 * per_epoch,
                     "step_ms": 1000 * step, "peak_bytes": peak})
        where = f", {args.part.num_parts} ranks" if distributed(args) else ""
        print(f"{args.model} on {data.name}, {label}{where}: {1000 * per_epoch:.1f} ms/epoch "
              f"(training step {1000 * step:.1f} ms), first epoch with compilation "
              f"{first:.1f} s, peak intermediate memory {peak / 2 ** 20:.1f} MiB")
        if distributed(args):
            from ngnn.distributed.launch import bench_line
            print(bench_line(trainer, before, len(trainer.history)))
    if args.plot and _is_root(args):
        plots.bench_bars(rows, args.plot, title=f"{args.model} on {data.name}, "
                         f"{args.epochs} epochs")
        print(f"benchmark plot written to {args.plot}")
    return 0


def cmd_profile(args):
    """The kernel report of the model's training step (or evaluation pass) on the GPU."""
    from ngnn import transformers as ngt
    from ngnn.profiling import format_report, format_transfers, profile_computation
    if args.backend != "gpu":
        print(f"ngnn profile: the {args.backend} backend runs no device kernels; profile "
              "reports the kernels of --backend gpu", file=sys.stderr)
        return 2
    data = load_dataset(args)
    print(data.summary())
    transformer = ngt.make_transformer(
        "gpu", time_kernels=True, wide_accumulation=not args.float32_sums)
    try:
        trainer = make_trainer(args, data, args.seed, transformer=transformer)
        rows, seconds, first, later = profile_computation(trainer, args.computation,
                                                          args.steps)
        runtime = transformer.runtime
        what = "training step" if args.computation == "train" else "evaluation"
        print(f"{args.model} on {data.name}, {what}: {len(rows)} kernels, {runtime.name} on "
              f"{runtime.device_name}; {seconds * 1e3:.2f} ms per call (best of "
              f"{args.steps})")
        print(format_report(rows))
        print(format_transfers(first, later))
    finally:
        transformer.close()
    return 0


def cmd_calibrate(args):
    from ngnn import simulate
    start = time.perf_counter()
    topology, path, notes = simulate.calibrate(args.out, quick=args.quick, mpi=not args.no_mpi)
    device, link = topology.device(), topology.link()
    print(f"calibrated in {time.perf_counter() - start:.1f} s: matrix product "
          f"{device.flops / 1e9:.1f} GFLOP/s, element-wise {device.memory_bandwidth / 1e9:.1f} "
          f"GB/s, exp {device.transcendental_rate / 1e9:.2f} G/s, dropout "
          f"{device.dropout_rate / 1e9:.2f} G/s, call {1e6 * device.call_overhead:.2f} us")
    for name, curve in sorted(device.curves.items()):
        figures = ", ".join(f"{1e9 * seconds:.1f}" for seconds in curve.seconds[0])
        print(f"  {name}: ns per item at widths {', '.join(map(str, map(int, curve.widths)))}"
              f" ({int(curve.rows[0])} rows): {figures}")
    for note in notes:
        print(f"  {note}")
    if not notes:
        print(f"  MPI, 2 ranks: latency {1e6 * link.latency:.1f} us, bandwidth "
              f"{link.bandwidth / 1e9:.2f} GB/s, all-reduce {1e6 * link.allreduce_latency:.1f} us"
              f" + {link.allreduce_bandwidth / 1e9:.2f} GB/s, 2 ranks compute "
              f"{link.contention:.2f}x slower side by side; a waiting rank's sleeps overrun "
              f"by {1e6 * link.poll_slack:.0f} us")
    print(f"profile written to {path}")
    return 0


def load_topology(name):
    """A topology from FILE, a preset's name, or (None) the calibrated profile."""
    from ngnn import simulate
    if name in simulate.topology.PRESETS:
        return simulate.preset(name)
    path = name or simulate.default_profile_path()
    if name is None and not os.path.exists(path):
        raise ValueError(f"no profile at {path}: run `ngnn calibrate` first, or pass "
                         "--topology FILE (or a preset: "
                         f"{', '.join(simulate.topology.PRESETS)})")
    return simulate.Topology.load(path)


def cmd_simulate(args):
    """Predicts what `ngnn bench` measures: a training step, and an epoch (the step plus
    the evaluation), on the NumPy transformer; over ranks with --parts. Several --parts,
    --partition or --topology values: every combination, ranked by predicted step."""
    from ngnn import simulate
    from ngnn import transformers as ngt
    topologies = [load_topology(name) for name in (args.topology or [None])]
    data = load_dataset(args)
    print(data.summary())
    args.backend = "numpy"

    def build(part, comm):
        args.part = part
        return make_trainer(args, data, args.seed, comm=comm,
                            transformer=ngt.make_transformer("numpy",
                                                             fusion=not args.unfused))

    layouts = list(dict.fromkeys((parts, policy if parts > 1 else None)
                                 for parts in args.parts for policy in args.policies))
    label = "numpy" if not args.unfused else "numpy, no fusion"
    predictions = []
    for parts, policy in layouts:
        trainers = simulate.build_trainers(build, data, parts, policy)
        try:
            for topology in topologies:
                prediction = simulate.predict_training(build, data, topology, parts, policy,
                                                       trainers=trainers)
                predictions.append(prediction)
                print(prediction_line(args.model, data.name, label, prediction))
        finally:
            for trainer in trainers[0]:
                trainer.transformer.close()
    if args.trace:
        print(f"predicted timeline written to {predictions[0].write_trace(args.trace)}")
    if len(predictions) > 1:
        print(ranking_table(predictions))
    return 0


def prediction_line(model, dataset, label, prediction):
    """The line `ngnn bench` prints, with predicted figures."""
    topology = prediction.topology
    unvalidated = "" if topology.validated else ", unvalidated profile"
    where = "" if prediction.parts == 1 else f", {prediction.parts} ranks ({prediction.policy})"
    peak = max(prediction.peak_bytes)
    line = (f"{model} on {dataset}, {label}{where}, predicted on {topology.name}{unvalidated}: "
            f"{1000 * prediction.epoch_time:.1f} ms/epoch (training step "
            f"{1000 * prediction.step_time:.1f} ms), peak intermediate memory "
            f"{peak / 2 ** 20:.1f} MiB{' per rank (largest)' if prediction.parts > 1 else ''}")
    if prediction.parts > 1:
        line += (f"\n  per step: compute {1000 * prediction.compute:.1f} ms, communication "
                 f"{1000 * prediction.communication:.1f} ms, waiting "
                 f"{1000 * prediction.waiting:.1f} ms; replication factor "
                 f"{prediction.replication_factor:.3f}; peak per rank "
                 + ", ".join(f"{b / 2 ** 20:.1f}" for b in prediction.peak_bytes) + " MiB")
    return line


def ranking_table(predictions):
    """The configurations, fastest predicted training step first, as a markdown table."""
    ranked = sorted(predictions, key=lambda p: p.step_time)
    fastest = ranked[0].step_time
    lines = ["", "| rank | configuration | training step (ms) | epoch (ms) | vs fastest | "
             "peak per rank (MiB) |", "|---:|---|---:|---:|---:|---:|"]
    for i, p in enumerate(ranked, 1):
        mark = "" if p.topology.validated else " (unvalidated)"
        lines.append(f"| {i} | {p.label}{mark} | {1000 * p.step_time:.1f} | "
                     f"{1000 * p.epoch_time:.1f} | {p.step_time / fastest:.2f}x | "
                     f"{max(p.peak_bytes) / 2 ** 20:.1f} |")
    return "\n".join(lines)


# ---- argument parsing --------------------------------------------------------------------
# Every numeric option is checked as it is parsed, so a bad value is an argparse error
# naming the option (NaN and infinities included), never a traceback later.

def chunking(step):
    """How a training step ran under --memory-budget."""
    if not step.chunked:
        return "memory budget: the training step fits, unchunked"
    s, mib = step.stats, 2 ** 20
    return (f"memory budget: training step in {s['chunks']} x {s['chunks']} chunks "
            f"({s['pieces']} pieces, {s['stages']} stages), device peak "
            f"{s['device_peak_bytes'] / mib:.1f} MiB of {s['budget_bytes'] / mib:.1f} MiB, "
            f"{s['bytes_to_device'] / mib:.1f} MiB to and {s['bytes_from_device'] / mib:.1f} "
            f"MiB from the device per step")


def byte_count(text):
    """"268435456", "256M", "1.5G" -> bytes (K, M, G are powers of 1024)."""
    scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:].upper(), 1)
    try:
        value = float(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bytes such as 268435456 or 256M, got "
                                         f"{text!r}") from None
    if not np.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return int(value)


def integer(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    parse.__name__ = "integer"
    return parse
def real(low, high=float("inf"), low_open=False, high_open=True):
    """A finite float in the interval from `low` to `high` (open where said)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not np.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < low or (low_open and value == low) or value > high or \
                (high_open and value == high):
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
        return value
    parse.__name__ = "number"
    return parse


def cmd_partition(args):
    from ngnn import distributed as dist
    data = load_dataset(args)
    print(data.summary())
    start = time.perf_counter()
    parts = dist.partition(data.graph, args.parts, args.policy)
    seconds = time.perf_counter() - start
    parts.save(args.out)
    print(f"{parts.summary()} (partitioned in {seconds:.2f} s)")
    print(f"wrote {args.out}: manifest.json and part0..{args.parts - 1}.npz; train with "
          f"mpiexec -n {args.parts} ngnn train --dataset {args.dataset} --partition-dir "
          f"{args.out}")
    return 0


def _add_distributed_options(parser):
    group = parser.add_argument_group("distributed (run under mpiexec -n K)")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--partition", choices=("oec", "iec", "cvc", "metis"),
                       help="partition the graph over the K ranks with this policy")
    where.add_argument("--partition-dir", metavar="FOLDER",
                       help="use the partition saved in FOLDER by `ngnn partition`")


def _add_model_options(parser, datasets):
    parser.add_argument("--model", choices=MODELS, default="gcn")
    parser.add_argument("--dataset", choices=datasets, default="cora",
                        help="an embedded dataset, or a synthetic graph (sbm, rmat)")
    parser.add_argument("--hidden", type=integer(1), help="hidden features (per head for gat)")
    parser.add_argument("--heads", type=integer(1), help="attention heads of gat's first layer")
    parser.add_argument("--dropout", type=real(0.0, 1.0))
    parser.add_argument("--attn-dropout", type=real(0.0, 1.0),
                        help="gat's dropout on attention coefficients (default: the recipe's)")
    parser.add_argument("--lr", type=real(0.0, low_open=True))
    parser.add_argument("--weight-decay", type=real(0.0),
                        help="L2 weight decay (appnp: of the first layer's weights, as its "
                        "paper; gcnii: of the dense layers)")
    parser.add_argument("--conv-weight-decay", type=real(0.0),
                        help="gcnii: weight decay of the convolutions (--weight-decay: of "
                        "the dense layers)")
    parser.add_argument("--num-layers", type=integer(1), help="gcnii: convolution layers")
    parser.add_argument("--num-bases", type=integer(0),
                        help="rgcn: relation weights as combinations of this many bases "
                        "(0: one free matrix per relation)")
    parser.add_argument("--seed", type=integer(0), default=0,
                        help="seed of the first run; run i uses seed + i")
    parser.add_argument("--no-normalize-features", dest="normalize_features",
                        action="store_false", default=None,
                        help="keep the raw features (default: as the recipe says; --task link "
                        "keeps them raw, as GAE does)")
    parser.add_argument("--normalize-features", dest="normalize_features",
                        action="store_true", default=None,
                        help="scale feature rows to sum 1 (default: as the recipe says)")
    parser.add_argument("--sparse-features", choices=tuple(SPARSE_CHOICES), default="auto",
                        help="feed the features as a sparse matrix (auto: when under 10%% "
                        "of them are non-zero)")
    synthetic = parser.add_argument_group("synthetic datasets")
    synthetic.add_argument("--num-nodes", type=integer(1), default=10000)
    synthetic.add_argument("--avg-degree", type=real(0.0, low_open=True), default=10.0)
    synthetic.add_argument("--num-features", type=integer(1), default=64)
    synthetic.add_argument("--num-classes", type=integer(2), default=4)
    synthetic.add_argument("--data-seed", type=integer(0), default=0)


def make_parser():
    datasets = dataset_choices()
    backends = ["numpy", "gpu"]
    parser = argparse.ArgumentParser(prog="ngnn", description="ngnn: a compiler for graph "
                                     "neural networks")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model and report its accuracy")
    _add_model_options(train, datasets + graph_dataset_choices())
    _add_task_options(train)
    _add_link_options(train)
    train.add_argument("--backend", choices=backends, default="numpy")
    train.add_argument("--epochs", type=integer(1))
    train.add_argument("--patience", type=integer(0),
                       help="stop when val accuracy and loss stall this many epochs (0: never; "
                       "default: the recipe's)")
    train.add_argument("--runs", type=integer(1), default=1)
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--save", metavar="PATH", help="save the trained weights (.npz)")
    train.add_argument("--debug-nans", action="store_true",
                       help="check every op's output and stop at the first NaN or Inf, "
                       "naming the op and its line (slower; docs/errors.md)")
    train.add_argument("--memory-budget", type=byte_count, metavar="BYTES",
                       help="device memory a training step may use (e.g. 256M): a step "
                       "that needs more runs chunk by chunk (docs/out_of_core.md)")
    train.add_argument("--plot", metavar="FILE",
                       help="draw loss and train/val accuracy per epoch (.png, .svg, .pdf)")
    train.add_argument("--float32-sums", action="store_true",
                       help="add sums in float32 (faster; results then depend on "
                       "summation order, so K ranks differ from one process in the last "
                       "bits); by default they accumulate in float64")
    train.add_argument("--native", action="store_true",
                       help="numpy backend: run batch norm, row-wise chains and sparse "
                       "products as C compiled on this machine (docs/native.md)")
    minibatch = train.add_argument_group("minibatches (ngnn.sampling)")
    minibatch.add_argument("--batch-size", type=integer(1),
                           help="train from sampled minibatches of this many seeds")
    minibatch.add_argument("--fanouts", type=fanout_list, metavar="F1,F2,...",
                           help="in-edges sampled per vertex for each layer, first to last "
                                "(-1: all; default all)")
    minibatch.add_argument("--eval-fanouts", type=fanout_list, metavar="F1,F2,...",
                           help="evaluate from sampled batches (default: the full graph)")
    _add_distributed_options(train)
    train.set_defaults(func=cmd_train)

    listing = sub.add_parser("datasets", help="list the embedded datasets")
    listing.set_defaults(func=cmd_datasets)

    show = sub.add_parser("show-ir", help="print the IR of a model's training step after "
                          "each pass")
    _add_model_options(show, datasets)
    show.add_argument("--backend", choices=backends, default="numpy")
    show.add_argument("--computation", choices=("train", "eval"), default="train")
    show.add_argument("--only", metavar="PASS", help="print (or draw) only the IR after "
                      "this pass; a picture defaults to the last pass")
    picture = show.add_argument_group("pictures (need Graphviz)")
    picture.add_argument("--out", metavar="FILE", help="draw the op-graph to FILE instead "
                         "of printing it: fused groups as boxes, stored values marked")
    picture.add_argument("--format", choices=("dot", "svg", "png", "pdf"),
                         help="picture format (default: FILE's extension)")
    picture.add_argument("--collapse", action="store_true",
                         help="draw each fused group as a single box")
    picture.add_argument("--forward", action="store_true",
                         help="draw only the forward ops (not the gradient and the updates)")
    picture.add_argument("--layer", metavar="NAME",
                         help="draw only the forward ops of one layer (conv1, conv2, ...)")
    show.set_defaults(func=cmd_show_ir)

    bench = sub.add_parser("bench", help="time per epoch on each backend")
    _add_model_options(bench, datasets)
    bench.add_argument("--backend", choices=backends,
                       help="one backend (default: every backend that runs here)")
    bench.add_argument("--epochs", type=integer(2), default=20)
    bench.add_argument("--unfused", action="store_true",
                       help="also time each backend with fusion off")
    bench.add_argument("--plot", metavar="FILE", help="draw time per epoch and peak memory "
                       "per backend and configuration (.png, .svg, .pdf)")
    _add_distributed_options(bench)
    bench.set_defaults(func=cmd_bench)

    part = sub.add_parser("partition", help="partition a dataset's graph and save it")
    _add_model_options(part, datasets)
    part.add_argument("--parts", type=int, required=True, help="number of parts (ranks)")
    part.add_argument("--policy", choices=("oec", "iec", "cvc", "metis"), default="cvc")
    part.add_argument("--out", required=True, metavar="FOLDER")
    part.set_defaults(func=cmd_partition)

    _add_profile_parser(sub, datasets, backends)

    calibrate = sub.add_parser("calibrate", help="measure this machine for `ngnn simulate` "
                               "(about 30 s)")
    calibrate.add_argument("--out", metavar="FILE", help="where to write the profile "
                           "(default: profile.json under NGNN_CACHE_DIR or ~/.cache/ngnn)")
    calibrate.add_argument("--quick", action="store_true", help="small sizes: a rough "
                           "profile in a few seconds")
    calibrate.add_argument("--no-mpi", action="store_true", help="do not start 2 MPI ranks "
                           "to measure the link")
    calibrate.set_defaults(func=cmd_calibrate)

    simulate = sub.add_parser("simulate", help="predict what `ngnn bench` measures, "
                              "without training")
    _add_model_options(simulate, datasets)
    simulate.add_argument("--topology", metavar="FILE", nargs="+",
                          help="topologies or profiles (JSON, or a preset: h100, a100; "
                          "default: the one `ngnn calibrate` wrote)")
    simulate.add_argument("--parts", type=integer(1), nargs="+", default=[1], metavar="K",
                          help="ranks to predict (several: each, ranked)")
    simulate.add_argument("--partition", dest="policies", nargs="+", default=["cvc"],
                          choices=("oec", "iec", "cvc", "metis"), metavar="POLICY",
                          help="partition policies for --parts above 1 (oec, iec, cvc, "
                          "metis; default cvc)")
    simulate.add_argument("--unfused", action="store_true", help="predict with fusion off")
    simulate.add_argument("--trace", metavar="FILE", help="write the training step's "
                          "predicted timeline as a Chrome trace (JSON)")
    simulate.set_defaults(func=cmd_simulate)
    return parser


def _add_profile_parser(sub, datasets, backends):
    profile = sub.add_parser("profile", help="per-kernel report of a GPU training step: "
                             "launches, work-groups, edges per work-group, bytes, time")
    _add_model_options(profile, datasets)
    profile.add_argument("--backend", choices=backends, default="gpu")
    profile.add_argument("--computation", choices=("train", "eval"), default="train")
    profile.add_argument("--steps", type=integer(1), default=5,
                         help="calls after the first (which compiles); the table is the "
                         "last one's")
    profile.add_argument("--float32-sums", action="store_true",
                         help="add sums in float32, as `ngnn train --float32-sums`")
    profile.set_defaults(func=cmd_profile)


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if distributed(args) or graph_ranks(args) > 1:
        from ngnn.distributed.launch import run_on_ranks
        return run_on_ranks(args.command, lambda: fill_defaults(args) or args.func(args))
    try:
        if hasattr(args, "model"):
            fill_defaults(args)
        return args.func(args)
    except (ValueError, RuntimeError, OSError, ImportError, FloatingPointError,
            MemoryError) as err:
        print(f"ngnn {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
