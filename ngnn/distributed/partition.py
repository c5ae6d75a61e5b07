"""Graph partitions with masters and mirrors (seed 004, CuSP's policies).

Every vertex has one master, on the part (rank) `owner[v]`; every edge lives on one part,
`edge_part[e]`. A part keeps the masters it owns plus a mirror of every other vertex its
edges touch. Policies:

* ``oec`` (outgoing edge cut): masters in contiguous id ranges balanced by the average
  degree + out-degree (a rank's dense work goes with its vertices, its edge work with
  its edges: each counts about half); an edge lives with its source's master.
* ``iec`` (incoming edge cut): ranges balanced by the average degree + in-degree; an
  edge lives with its
  destination's master. Only sources are mirrored, and a mirror has no in-edges, so
  aggregations at destinations are complete on the master's part: their mirror reduction
  sends nothing.
* ``cvc`` (Cartesian vertex cut): the parts form an R x C grid; masters are balanced
  ranges of a fixed pseudo-random vertex order (hubs spread out), and edge s -> d lives on
  the part in the grid row of owner[s] and the grid column of owner[d]. A vertex is
  mirrored on at most R + C - 1 parts.
* ``metis``: METIS (through the optional `pymetis` package) minimizes the edges cut on
  the undirected graph, with vertices weighted by 1 + in-degree; an edge lives with its
  destination's master.

Everything is vectorized NumPy; the per-part views (masters, mirrors, the exchange lists)
are computed when first asked for.
"""
import functools
import json
import os
import tempfile
import zipfile

import numpy as np

from ngnn.vertex_order import metis_parts

POLICIES = ("oec", "iec", "cvc", "metis")
FORMAT = "ngnn-partition"
VERSION = 1
CVC_ORDER_SEED = 0x9E3779B9


def partition(g, num_parts, policy="cvc"):
    """Partitions graph `g` into `num_parts` parts by `policy` (oec, iec, cvc, metis)."""
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)) or \
            num_parts < 1:
        raise ValueError(f"partition: num_parts must be a positive int, got {num_parts!r}")
    num_parts = int(num_parts)
    if policy not in POLICIES:
        raise ValueError(f"partition: policy must be one of {POLICIES}, got {policy!r}")
    if num_parts > max(g.num_nodes, 1):
        raise ValueError(f"partition: {num_parts} parts for {g.num_nodes} vertices leaves "
                         "a part without masters")
    average = g.num_edges / max(g.num_nodes, 1)
    if policy == "oec":
        owner = balanced_ranges(average + g.out_degrees, num_parts)
        edge_part = owner[g.src]
    elif policy == "iec":
        owner = balanced_ranges(average + g.in_degrees, num_parts)
        edge_part = owner[g.dst]
    elif policy == "cvc":
        order = np.random.default_rng(CVC_ORDER_SEED).permutation(g.num_nodes)
        owner = np.empty(g.num_nodes, np.int64)
        owner[order] = balanced_ranges((1 + g.in_degrees + g.out_degrees)[order], num_parts)
        rows, cols = grid_shape(num_parts)
        # Lookups in int16 tables: their random reads stay in cache, int64 ones do not.
        small = owner.astype(np.int16 if num_parts < 2 ** 15 else np.int64)
        row_start, col = (small // cols) * cols, small % cols
        edge_part = (np.take(row_start, g.src) + np.take(col, g.dst)).astype(np.int64)
    else:
        owner = metis_owner(g, num_parts)
        edge_part = owner[g.dst]
    return Partition(g.src, g.dst, owner, edge_part, num_parts, policy, g.fingerprint)


def balanced_ranges(weights, num_parts):
    """Part of each vertex when vertices are cut, in order, into `num_parts` contiguous
    ranges of about equal total weight."""
    weights = np.asarray(weights, dtype=np.float64)
    before = np.cumsum(weights) - weights
    total = max(float(weights.sum()), 1.0)
    return np.minimum((before * num_parts / total).astype(np.int64), num_parts - 1)


def equal_ranges(num_nodes, num_parts):
    """balanced_ranges(np.ones(num_nodes), num_parts) in integers, several times as fast:
    vertex i in range i * num_parts // num_nodes (the float quotient of balanced_ranges
    never rounds up to the next whole number while num_nodes * num_parts < 2 ** 53)."""
    return np.arange(num_nodes, dtype=np.int64) * num_parts // max(num_nodes, 1)


def grid_shape(num_parts):
    """R x C = num_parts with R the largest divisor not above sqrt(num_parts)."""
    rows = max(r for r in range(1, int(np.sqrt(num_parts)) + 1) if num_parts % r == 0)
    return rows, num_parts // rows


def metis_owner(g, num_parts):
    # Weighted by 1 + in-degree: a master brings its in-edges, so parts balance edges too.
    return metis_parts(g, num_parts, "partition policy 'metis' needs the pymetis package: "
                       "pip install pymetis (or ngnn's [mpi] extra)",
                       vertex_weights=1 + g.in_degrees)


class Partition:
    """The result of `partition`: `owner` (N,), `edge_part` (E,), per-part `masters(p)` and
    `mirrors(p)` (global ids, ascending), `replication_factor`, `vertex_imbalance` and
    `edge_imbalance` (largest part over the mean, of masters and of edges)."""

    def __init__(self, src, dst, owner, edge_part, num_parts, policy, fingerprint):
        self.src, self.dst = src, dst
        self.owner = owner
        self.edge_part = edge_part
        self.num_parts = num_parts
        self.policy = policy
        self.fingerprint = fingerprint
        self.num_nodes, self.num_edges = owner.shape[0], edge_part.shape[0]

    def masters(self, p):
        return np.flatnonzero(self.owner == p)

    def edges(self, p):
        return np.flatnonzero(self.edge_part == p)

    def mirrors(self, p):
        return self._mirrors[p]

    @functools.cached_property
    def _mirrors(self):
        mirrors = []
        touched = np.zeros(self.num_nodes, bool)
        for p in range(self.num_parts):
            eids = self.edges(p)
            touched[:] = False
            touched[self.src[eids]] = True
            touched[self.dst[eids]] = True
            touched[self.owner == p] = False
            mirrors.append(np.flatnonzero(touched))
        return mirrors

    @property
    def replication_factor(self):
        """(masters + mirrors) / N: how many copies of a vertex there are on average."""
        copies = self.num_nodes + sum(m.shape[0] for m in self._mirrors)
        return copies / max(self.num_nodes, 1)

    @property
    def vertex_imbalance(self):
        return _imbalance(np.bincount(self.owner, minlength=self.num_parts))

    @property
    def edge_imbalance(self):
        return _imbalance(np.bincount(self.edge_part, minlength=self.num_parts))

    def summary(self):
        return (f"{self.policy} partition into {self.num_parts}: replication factor "
                f"{self.replication_factor:.3f}, vertex imbalance {self.vertex_imbalance:.3f}, "
                f"edge imbalance {self.edge_imbalance:.3f}")

    def part(self, p):
        """Part `p` as a LocalPart: its vertices (masters first, then mirrors, each in id
        order), its edges in local ids, and the exchange lists with every other part."""
        if not 0 <= p < self.num_parts:
            raise ValueError(f"partition has parts 0..{self.num_parts - 1}, not {p}")
        masters, mirrors = self.masters(p), self.mirrors(p)
        nodes = np.concatenate([masters, mirrors])
        local = np.full(self.num_nodes, -1, np.int64)
        local[nodes] = np.arange(nodes.shape[0])
        eids = self.edges(p)
        mirror_owner = self.owner[mirrors]
        mirrors_from, masters_to = {}, {}
        for q in range(self.num_parts):
            if q == p:
                continue
            theirs = mirrors[mirror_owner == q]
            if theirs.size:
                mirrors_from[q] = local[theirs]
            ours = self.mirrors(q)
            ours = ours[self.owner[ours] == p]
            if ours.size:
                masters_to[q] = local[ours]
        return LocalPart(rank=p, num_parts=self.num_parts, nodes=nodes,
                         num_masters=masters.shape[0], edges=eids,
                         src=local[self.src[eids]], dst=local[self.dst[eids]],
                         mirrors_from=mirrors_from, masters_to=masters_to,
                         manifest=self.manifest())

    def manifest(self):
        return {"format": FORMAT, "version": VERSION, "num_parts": self.num_parts,
                "policy": self.policy, "num_nodes": int(self.num_nodes),
                "num_edges": int(self.num_edges), "graph_fingerprint": self.fingerprint,
                "replication_factor": self.replication_factor,
                "vertex_imbalance": self.vertex_imbalance,
                "edge_imbalance": self.edge_imbalance,
                "parts": [f"part{p}.npz" for p in range(self.num_parts)]}

    def save(self, folder):
        """Writes `manifest.json` and `part<p>.npz` (no pickles) into `folder`, each file
        atomically; the manifest goes last, so a folder with a manifest is complete."""
        folder = os.fspath(folder)
        os.makedirs(folder, exist_ok=True)
        manifest = self.manifest()
        for p in range(self.num_parts):
            _atomic_write(os.path.join(folder, manifest["parts"][p]),
                          lambda f, p=p: np.savez(f, **self.part(p).arrays()))
        _atomic_write(os.path.join(folder, "manifest.json"),
                      lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        return folder

    def __repr__(self):
        return f"<Partition {self.summary()}>"


def _imbalance(counts):
    mean = counts.mean()
    return float(counts.max() / mean) if mean else 1.0


def _atomic_write(path, write):
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                                         suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as f:
            write(f)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


class LocalPart:
    """One rank's share of a partition: `nodes` (global ids of its vertices, the
    `num_masters` masters first), `edges` (global edge ids, ascending) with `src`/`dst` in
    local ids, and for each other rank q: `mirrors_from[q]` (local ids of the mirrors whose
    master q owns) and `masters_to[q]` (local ids of the masters q mirrors), both in global
    id order so that q's lists line up with them."""

    def __init__(self, rank, num_parts, nodes, num_masters, edges, src, dst, mirrors_from,
                 masters_to, manifest):
        self.rank, self.num_parts = rank, num_parts
        self.nodes, self.num_masters = nodes, int(num_masters)
        self.edges, self.src, self.dst = edges, src, dst
        self.mirrors_from, self.masters_to = mirrors_from, masters_to
        self.manifest = manifest

    @property
    def num_mirrors(self):
        return self.nodes.shape[0] - self.num_masters

    def arrays(self):
        arrays = {"rank": np.int64(self.rank), "num_parts": np.int64(self.num_parts),
                  "nodes": self.nodes, "num_masters": np.int64(self.num_masters),
                  "edges": self.edges, "src": self.src, "dst": self.dst}
        arrays.update({f"mirrors_from_{q}": ids for q, ids in self.mirrors_from.items()})
        arrays.update({f"masters_to_{q}": ids for q, ids in self.masters_to.items()})
        return arrays

    def check_graph(self, g):
        """Refuses a graph other than the one this partition was made from."""
        m = self.manifest
        if g.fingerprint != m["graph_fingerprint"]:
            raise ValueError(f"the partition was made from another graph ({m['num_nodes']} "
                             f"vertices, {m['num_edges']} edges, fingerprint "
                             f"{m['graph_fingerprint'][:12]}) than this one ({g.num_nodes} "
                             f"vertices, {g.num_edges} edges, fingerprint "
                             f"{g.fingerprint[:12]})")


def load_partition(folder, rank):
    """Part `rank` of the partition saved in `folder`, checked against its manifest."""
    folder = os.fspath(folder)
    path = os.path.join(folder, "manifest.json")
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode())
    except FileNotFoundError:
        raise ValueError(f"{folder} holds no partition (no manifest.json); write one with "
                         "`ngnn partition` or Partition.save") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a partition manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or \
            manifest.get("version") != VERSION:
        raise ValueError(f"{path} is not an ngnn partition manifest (format {FORMAT} "
                         f"version {VERSION})")
    num_parts = manifest["num_parts"]
    if not 0 <= rank < num_parts:
        raise ValueError(f"the partition in {folder} has {num_parts} parts, so it needs "
                         f"{num_parts} ranks; this is rank {rank}")
    part_path = os.path.join(folder, manifest["parts"][rank])
    if os.path.isfile(part_path) and not zipfile.is_zipfile(part_path):
        raise ValueError(f"partition file {part_path} is corrupt: not an .npz archive")
    try:
        with np.load(part_path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except Exception as err:
        raise ValueError(f"partition file {part_path} is missing or corrupt ({err})") from None
    try:
        part = LocalPart(
            rank=int(arrays.pop("rank")), num_parts=int(arrays.pop("num_parts")),
            nodes=arrays.pop("nodes"), num_masters=int(arrays.pop("num_masters")),
            edges=arrays.pop("edges"), src=arrays.pop("src"), dst=arrays.pop("dst"),
            mirrors_from={int(k.rsplit("_", 1)[1]): v for k, v in arrays.items()
                          if k.startswith("mirrors_from_")},
            masters_to={int(k.rsplit("_", 1)[1]): v for k, v in arrays.items()
                        if k.startswith("masters_to_")},
            manifest=manifest)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"partition file {part_path} lacks or garbles an entry ({err})"
                         ) from None
    _check_part(part, part_path, rank, manifest)
    return part


def _check_part(part, path, rank, manifest):
    n_local = part.nodes.shape[0]
    problems = []
    if part.rank != rank or part.num_parts != manifest["num_parts"]:
        problems.append(f"it is part {part.rank} of {part.num_parts}, the manifest expects "
                        f"part {rank} of {manifest['num_parts']}")
    for name in ("nodes", "edges", "src", "dst"):
        if getattr(part, name).dtype.kind not in "iu" or getattr(part, name).ndim != 1:
            problems.append(f"{name} is not a 1-D integer array")
    if not problems:
        if part.nodes.size and (part.nodes.min() < 0 or
                                part.nodes.max() >= manifest["num_nodes"]):
            problems.append("vertex ids out of range")
        if part.edges.size and (part.edges.min() < 0 or
                                part.edges.max() >= manifest["num_edges"]):
            problems.append("edge ids out of range")
        if not part.src.shape == part.dst.shape == part.edges.shape:
            problems.append("src, dst and edges differ in length")
        for ids in [part.src, part.dst] + list(part.mirrors_from.values()) + \
                list(part.masters_to.values()):
            if ids.size and (ids.min() < 0 or ids.max() >= n_local):
                problems.append("local ids out of range")
                break
        if not 0 <= part.num_masters <= n_local:
            problems.append("num_masters out of range")
    if problems:
        raise ValueError(f"partition file {path} is inconsistent: {'; '.join(problems)}")
