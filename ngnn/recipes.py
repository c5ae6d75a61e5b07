"""Training recipes: the published hyper-parameters of a model on a dataset.

`ngnn train` starts from `recipe(model, dataset)` and lets every value be overridden on the
command line. The table is data: one Recipe per (model, dataset) that a paper tuned, and a
default per model for every other dataset (synthetic graphs, models no paper tuned on it).

- Planetoid (cora, citeseer): GCN as Kipf & Welling (2017), GAT as Veličković et al. (2018),
  features row-normalized as their code does.
- APPNP (Klicpera et al. 2019), GCNII (Chen et al. 2020): their papers' Cora settings.
- R-GCN (Schlichtkrull et al. 2018): AIFB's settings, and MUTAG's for mutag_rdf.
- Co-purchase and co-authorship (amazon_photo, amazon_computers, coauthor_cs): GCN and GAT
  as Shchur et al. (2018), "Pitfalls of Graph Neural Network Evaluation" (the configurations
  of their gnn-benchmark code, config/optimized/*.yaml and config/train.conf.yaml): raw binary
  features, early stopping with patience 50.

docs/training.md shows the table with its sources and what differs from the papers' setups.

Below the table: a run built from its settings, by name (the model, the dataset, the
trainer, the defaults of graph classification and link prediction). `ngnn train` is a thin
layer over these; tests and benchmarks build the same runs with them.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Recipe:
    source: str                 # where the values come from
    hidden: int                 # hidden features (per head for GAT)
    dropout: float              # on each layer's input (and, for GAT, by default the attention)
    lr: float
    weight_decay: float         # L2, added to the gradient of every parameter (optim.Adam)
    epochs: int                 # the most epochs a run trains
    patience: object            # int: stop after this many epochs without progress; None: never
    normalize_features: bool    # rows scaled to sum 1 before training
    heads: int = 1              # GAT's first-layer attention heads
    attn_dropout: object = None  # GAT's dropout on attention coefficients (None: `dropout`)
    num_layers: object = None   # GCNII's convolutions
    conv_weight_decay: object = None  # GCNII's L2 of the convolutions (weight_decay: dense)
    num_bases: object = None    # R-GCN's bases (0: one free matrix per relation)

    def describe(self, model, dataset):
        """One line: `recipe: gcn on cora (Kipf & Welling 2017): hidden 16, ...`."""
        width = f"hidden {self.hidden}" + (f" x {self.heads} heads" if model == "gat" else "")
        dropout = f"dropout {self.dropout}"
        if model == "gat":
            dropout += f", attention dropout {self.attention_dropout()}"
        stop = f"up to {self.epochs} epochs" + \
            (f" (patience {self.patience})" if self.patience else "")
        features = "row-normalized features" if self.normalize_features else "raw features"
        extra = "".join(f", {name.replace('_', ' ')} {getattr(self, name)}"
                        for name in ("num_layers", "conv_weight_decay", "num_bases")
                        if getattr(self, name) is not None)
        return (f"recipe: {model} on {dataset} ({self.source}): {width}, {dropout}, "
                f"lr {self.lr}, weight decay {self.weight_decay}{extra}, {stop}, {features}")

    def attention_dropout(self):
        return self.dropout if self.attn_dropout is None else self.attn_dropout


PLANETOID = ("cora", "citeseer")
SHCHUR_DATASETS = ("amazon_photo", "amazon_computers", "coauthor_cs")

KIPF_GCN = Recipe("Kipf & Welling 2017", hidden=16, dropout=0.5, lr=0.01, weight_decay=5e-4,
                  epochs=200, patience=None, normalize_features=True)
VELICKOVIC_GAT = Recipe("Veličković et al. 2018", hidden=8, heads=8, dropout=0.6, lr=0.005,
                        weight_decay=5e-4, epochs=1000, patience=100,
                        normalize_features=True)
# Shchur et al. train for up to 100,000 epochs and stop by patience 50; runs here stop by
# patience long before the cap of 1000 (docs/training.md).
SHCHUR_GCN = Recipe("Shchur et al. 2018", hidden=64, dropout=0.8, lr=0.01, weight_decay=1e-3,
                    epochs=1000, patience=50, normalize_features=False)
SHCHUR_GAT = Recipe("Shchur et al. 2018", hidden=8, heads=8, dropout=0.6, attn_dropout=0.3,
                    lr=0.01, weight_decay=1e-2, epochs=1000, patience=50,
                    normalize_features=False)

# Every other dataset: the Planetoid recipes for GCN and GAT, ngnn's own for the others.
DEFAULTS = {
    "gcn": dataclasses.replace(KIPF_GCN, source="ngnn default: Kipf & Welling's Cora recipe"),
    "gat": dataclasses.replace(VELICKOVIC_GAT,
                               source="ngnn default: Veličković et al.'s Cora recipe"),
    "sage": Recipe("ngnn default", hidden=64, dropout=0.5, lr=0.01, weight_decay=5e-4,
                   epochs=200, patience=None, normalize_features=True),
    "gin": Recipe("ngnn default", hidden=64, dropout=0.5, lr=0.01, weight_decay=5e-4,
                  epochs=200, patience=None, normalize_features=True),
    # K = 10, alpha = 0.1; the weight decay is of the first layer's weights only.
    "appnp": Recipe("Klicpera et al. 2019", hidden=64, dropout=0.5, lr=0.01,
                    weight_decay=5e-3, epochs=2000, patience=100, normalize_features=True),
    # Cora's: 64 layers, alpha 0.1, lambda 0.5; weight decay 0.01 on the convolutions,
    # 5e-4 on the dense layers.
    "gcnii": Recipe("Chen et al. 2020", hidden=64, dropout=0.6, lr=0.01, weight_decay=5e-4,
                    epochs=1500, patience=100, normalize_features=True, num_layers=64,
                    conv_weight_decay=0.01),
    # Entity classification (AIFB's): 16 hidden, 50 epochs, Adam 0.01, no basis
    # decomposition and no L2.
    "rgcn": Recipe("Schlichtkrull et al. 2018", hidden=16, dropout=0.0, lr=0.01,
                   weight_decay=0.0, epochs=50, patience=None, normalize_features=False,
                   num_bases=0),
}

RECIPES = {
    **{("gcn", name): KIPF_GCN for name in PLANETOID},
    **{("gat", name): VELICKOVIC_GAT for name in PLANETOID},
    **{("gcn", name): SHCHUR_GCN for name in SHCHUR_DATASETS},
    **{("gat", name): SHCHUR_GAT for name in SHCHUR_DATASETS},
    # MUTAG (RDF): 30 bases and L2 5e-4.
    ("rgcn", "mutag_rdf"): dataclasses.replace(DEFAULTS["rgcn"], weight_decay=5e-4,
                                               num_bases=30),
}


def recipe(model, dataset):
    """The Recipe of `model` (a key of DEFAULTS: "gcn", "gat", ...) on `dataset` (a name)."""
    if model not in DEFAULTS:
        raise ValueError(f"recipe: unknown model {model!r}; expected one of {sorted(DEFAULTS)}")
    return RECIPES.get((model, dataset), DEFAULTS[model])


# ---- a run from its settings --------------------------------------------------------------
# `args` holds the command line's options as attributes (ngnn.cli.make_parser parses them);
# fill_defaults completes it from the recipes. Models and datasets are imported on use, so
# the command line starts without them.

MODELS = tuple(DEFAULTS)                # node classifiers by name: each has a recipe
SYNTHETIC = ("sbm", "rmat")             # generated datasets (ngnn.datasets.synthetic)
SPARSE_CHOICES = {"auto": None, "on": True, "off": False}   # --sparse-features: sparse=


def fill_defaults(args):
    """Settings left out (None) take the defaults of the task: for node classification the
    recipe of the model and dataset (`args.recipe` describes the values used, naming those
    given on the command line)."""
    task = getattr(args, "task", "node")
    if task != "graph":
        for key in GRAPH_ONLY:
            if getattr(args, key, None) is not None:
                raise ValueError(f"--{key.replace('_', '-')} applies to --task graph only "
                                 "(node and link training keep a constant learning rate)")
    if task == "link":
        return fill_link_defaults(args)
    if task == "graph":
        for key, value in GRAPH_DEFAULTS.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
        return
    chosen = recipe(args.model, args.dataset)
    given = []
    for field in dataclasses.fields(chosen):
        if field.name == "source" or not hasattr(args, field.name):
            continue
        if getattr(args, field.name) is None:
            setattr(args, field.name, getattr(chosen, field.name))
        elif getattr(args, field.name) != getattr(chosen, field.name):
            given.append(field.name)
    used = dataclasses.replace(chosen, **{f.name: getattr(args, f.name)
                                          for f in dataclasses.fields(chosen)
                                          if f.name != "source" and hasattr(args, f.name)})
    if getattr(args, "patience", None) == 0:       # --patience 0: no early stopping
        used = dataclasses.replace(used, patience=None)
        args.patience = None
    if args.model == "gat":
        args.attn_dropout = used.attention_dropout()
    elif getattr(args, "attn_dropout", None) is not None:
        raise ValueError("--attn-dropout applies to gat only")
    args.recipe = used.describe(args.model, args.dataset) + \
        (f"; from the command line: {', '.join(n.replace('_', ' ') for n in given)}"
         if given else "")


def build_model(name, data, hidden, heads, dropout, seed, attn_dropout=None, num_layers=None,
                num_bases=None):
    from ngnn import nn
    if name == "appnp":
        return nn.APPNP(data.num_features, hidden, data.num_classes, dropout=dropout,
                        seed=seed)
    if name == "gcnii":
        return nn.GCNII(data.num_features, hidden, data.num_classes, num_layers=num_layers,
                        dropout=dropout, seed=seed)
    if name == "rgcn":
        if data.graph.edge_type is None:
            raise ValueError(f"rgcn needs a dataset with relation-typed edges (aifb, "
                             f"mutag_rdf); {data.name} has none")
        return nn.RGCN(data.num_features, hidden, data.num_classes,
                       num_relations=data.graph.num_relations, num_bases=num_bases or None,
                       dropout=dropout, seed=seed)
    if name == "gcn":
        return nn.GCN(data.num_features, hidden, data.num_classes, dropout=dropout, seed=seed)
    if name == "gat":
        return nn.GAT(data.num_features, hidden=hidden, heads=heads,
                      num_classes=data.num_classes, dropout=dropout, seed=seed,
                      attn_dropout=attn_dropout)
    if name == "sage":
        return nn.GraphSAGE(data.num_features, hidden, data.num_classes, dropout=dropout,
                            seed=seed)
    return nn.GIN(data.num_features, hidden, data.num_classes, dropout=dropout, seed=seed)


def load_dataset(args):
    from ngnn import datasets
    if args.dataset in SYNTHETIC:
        return datasets.synthetic(args.dataset, args.num_nodes, args.avg_degree,
                                  args.num_features, args.num_classes, seed=args.data_seed)
    return datasets.load(args.dataset)


def run_transformer(args):
    """The transformer of a node, graph or link run: `args.backend`, with the debug_nans,
    memory_budget and native options when given."""
    from ngnn import transformers as ngt
    options = {key: getattr(args, key) for key in ("debug_nans", "memory_budget", "native")
               if getattr(args, key, None)}
    # The command line trains reproducibly: sums accumulate in float64, so K ranks give
    # one process's weights bit for bit (docs/distributed.md, "What is exact").
    return ngt.make_transformer(
        args.backend, wide_accumulation=not getattr(args, "float32_sums", False), **options)


def make_trainer(args, data, seed, transformer=None, comm=None):
    """The Trainer the command line builds; with `args.part` set, the DistributedTrainer of
    that part (over `comm`, default MPI's world)."""
    from ngnn import optim
    from ngnn.train import Trainer
    if transformer is None:
        transformer = run_transformer(args)
    model = build_model(args.model, data, args.hidden, args.heads, args.dropout, seed,
                        getattr(args, "attn_dropout", None), getattr(args, "num_layers", None),
                        getattr(args, "num_bases", None))
    weight_decay = args.weight_decay
    if args.model == "gcnii":
        weight_decay = model.weight_decays(conv=args.conv_weight_decay, dense=weight_decay)
    elif args.model == "appnp":
        weight_decay = model.weight_decays(first=weight_decay)
    optimizer = optim.Adam(model.parameters(), lr=args.lr, weight_decay=weight_decay)
    if getattr(args, "part", None) is not None:
        from ngnn.distributed import DistributedTrainer
        return DistributedTrainer(model, data, args.part, optimizer, backend=args.backend,
                                  seed=seed, normalize=args.normalize_features,
                                  transformer=transformer,
                                  sparse=SPARSE_CHOICES[args.sparse_features], comm=comm)
    minibatch = {key: getattr(args, key, None)
                 for key in ("batch_size", "fanouts", "eval_fanouts")}
    return Trainer(model, data, optimizer, backend=args.backend, seed=seed,
                   normalize=args.normalize_features, transformer=transformer,
                   sparse=SPARSE_CHOICES[args.sparse_features], **minibatch)


# ---- graph classification (ngnn/graph_train.py) ---------------------------------------------

GRAPH_MODELS = ("gin", "gcn")
# The GIN paper's settings (Xu et al. 2019): 5 layers counting the input, hidden 64 (its
# grid: 16 or 32 for the bio datasets, 64 for social), batch norm in the MLPs, batch 32,
# dropout 0.5 after each readout's linear map, Adam lr 0.01 halved every 50 epochs
# (lr_step epochs, lr_gamma the factor: torch's StepLR), 350 epochs.
GRAPH_DEFAULTS = dict(hidden=64, dropout=0.5, lr=0.01, lr_step=50, lr_gamma=0.5,
                      weight_decay=0.0, epochs=350)
GRAPH_ONLY = ("lr_step", "lr_gamma")        # options no other task reads


def graph_batch_size(args):
    return args.batch_size or 32        # the GIN paper's


def make_graph_trainer(args, data, transformer, comm=None):
    """The GraphTrainer of a graph classification run on `data` (a GraphDataset); with
    `comm` (an MPI communicator), the DistributedGraphLoaderTrainer over its ranks."""
    from ngnn import optim
    from ngnn.graph_train import GraphTrainer
    model = build_graph_model(args.model, data, args.hidden, args.dropout, args.seed)
    settings = dict(batch_size=graph_batch_size(args), lr=args.lr,
                    weight_decay=args.weight_decay, transformer=transformer, seed=args.seed,
                    schedule=optim.StepLR(args.lr_step, args.lr_gamma))
    if comm is not None:
        from ngnn.distributed import DistributedGraphLoaderTrainer
        return DistributedGraphLoaderTrainer(model, data, comm=comm, **settings)
    return GraphTrainer(model, data, **settings)


def build_graph_model(name, data, hidden, dropout, seed):
    from ngnn import nn
    if name == "gin":
        return nn.GINGraph(data.num_features, hidden, data.num_classes, dropout=dropout,
                           seed=seed)
    return nn.GCNGraph(data.num_features, hidden, data.num_classes, dropout=dropout, seed=seed)


# ---- link prediction (ngnn/link_train.py) ---------------------------------------------------

# The GAE paper's setting (Kipf & Welling 2016): a GCN encoder of 32 hidden and 16 latent
# features, no dropout or weight decay, Adam with lr 0.01 for 200 epochs, raw features.
LINK_DEFAULTS = dict(hidden=32, latent=16, dropout=0.0, lr=0.01, weight_decay=0.0, epochs=200,
                     decoder="dot", neg_ratio=1.0, split_seed=0)


def fill_link_defaults(args):
    for key, value in LINK_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.heads is None:
        args.heads = 8 if args.model == "gat" else 1      # the GAT paper's first layer
    if args.normalize_features is None:                   # GAE feeds raw features
        args.normalize_features = False


def build_encoder(args, data, seed):
    """The node model of --model, with --latent output features."""
    from ngnn import nn
    common = dict(dropout=args.dropout, seed=seed)
    if args.model == "gcn":
        return nn.GCN(data.num_features, args.hidden, args.latent, **common)
    if args.model == "gat":
        return nn.GAT(data.num_features, hidden=args.hidden, heads=args.heads,
                      num_classes=args.latent, **common)
    if args.model == "sage":
        return nn.GraphSAGE(data.num_features, args.hidden, args.latent, **common)
    return nn.GIN(data.num_features, args.hidden, args.latent, **common)


def make_link_trainer(args, data, split, seed, transformer):
    """The LinkTrainer of a link run on `data` over its `split` (datasets.link_split): the
    encoder of --model and the decoder of --decoder, trained with Adam."""
    from ngnn import nn, optim
    from ngnn.link_train import LinkTrainer
    encoder = build_encoder(args, data, seed)
    decoder = nn.MLPDecoder(args.latent, args.latent, seed=seed) \
        if args.decoder == "mlp" else nn.DotDecoder()
    model = nn.LinkPredictor(encoder, decoder)
    return LinkTrainer(model, split, optim.Adam(model.parameters(), lr=args.lr,
                                                weight_decay=args.weight_decay),
                       seed=seed, normalize=args.normalize_features, transformer=transformer,
                       sparse=SPARSE_CHOICES[args.sparse_features], neg_ratio=args.neg_ratio)
