"""Negative sampling for link prediction: vertex pairs that are not edges.

    sampler = NegativeSampler(split.graph, seed=None)     # the key: like a dropout's
    neg = sampler.sample(count, epoch)                    # (2, count) int64, u != v

Every pair is a pure function of (seed, stream, count): candidates are read from Philox
(ngnn.philox) at consecutive positions of one stream, two 32-bit words per candidate, and
the first `count` that pass the filters are kept, so the same pairs come out on every
machine. A training sampler uses the epoch as its stream, so each epoch gets fresh
negatives that a rerun reproduces. Its key, when not given, comes from the counter that
gives dropouts theirs (`dropout_seed`), so whatever reseeds dropout reseeds negatives too.

A candidate (u, v) is dropped when u == v, when it is a forbidden pair (an edge: the
positives), and, when `distinct`, when it repeats an earlier one. In an undirected graph a
pair is an unordered one, written u < v, so (v, u) of an edge is an edge too.
"""
import numbers

import numpy as np

from ngnn import philox
from ngnn.op_graph.training_ops import dropout_seed

# Candidates drawn per round: what is still missing, scaled by the share of pairs that pass
# (estimated from the number of forbidden pairs), plus slack; a round is one vectorized draw.
SLACK = 1.1
MIN_ROUND = 64
# Streams from here up belong to datasets.link_split's draws; a training epoch's are below.
SPLIT_STREAM = 2 ** 62


def pair_keys(src, dst, num_nodes):
    """int64 keys u * num_nodes + v of pairs (one per entry of src, dst)."""
    return np.asarray(src, np.int64) * np.int64(num_nodes) + np.asarray(dst, np.int64)


def edge_set(graph, undirected):
    """The sorted distinct keys of the graph's edges, as pairs are written (u < v when
    `undirected`)."""
    src, dst = graph.src, graph.dst
    if undirected:
        src, dst = np.minimum(src, dst), np.maximum(src, dst)
    return np.unique(pair_keys(src, dst, graph.num_nodes))


def is_undirected(graph):
    """Whether every edge u -> v has its reverse v -> u."""
    forward = np.unique(pair_keys(graph.src, graph.dst, graph.num_nodes))
    backward = np.unique(pair_keys(graph.dst, graph.src, graph.num_nodes))
    return forward.shape == backward.shape and bool(np.array_equal(forward, backward))


def possible_pairs(num_nodes, undirected):
    """Pairs u != v there are to draw from."""
    pairs = num_nodes * (num_nodes - 1)
    return pairs // 2 if undirected else pairs


def draw_non_edges(seed, stream, count, num_nodes, forbidden, undirected, distinct,
                   what="negatives"):
    """(2, count) int64 pairs u != v whose keys are not in the sorted array `forbidden`
    (pairs u < v when `undirected`), distinct from each other when `distinct`; Philox
    words of `stream` under key `seed`, from position 0. `what` names the draw in errors."""
    count = int(count)
    if num_nodes > 2 ** 32:
        raise ValueError(f"{what}: graphs of more than 2**32 nodes are not supported, got "
                         f"{num_nodes}")
    available = possible_pairs(num_nodes, undirected) - forbidden.size
    if count and (available < (count if distinct else 1)):
        raise ValueError(f"{what}: {count} {'distinct ' if distinct else ''}vertex pairs that "
                         f"are not edges are needed, but the graph has only {max(available, 0)}"
                         f" ({num_nodes} nodes, {forbidden.size} edges)")
    kept = np.empty(0, np.int64)
    position = 0
    passing = max(available, 1) / max(possible_pairs(num_nodes, undirected), 1)
    while kept.size < count:
        missing = count - kept.size
        batch = int(missing / passing * SLACK) + MIN_ROUND
        words = philox.words(seed, position, 2 * batch, stream).astype(np.uint64)
        position += 2 * batch
        # Multiply-shift maps a 32-bit word onto [0, num_nodes) (Lemire's reduction).
        ends = ((words * np.uint64(num_nodes)) >> np.uint64(32)).astype(np.int64)
        u, v = ends[0::2], ends[1::2]
        if undirected:
            u, v = np.minimum(u, v), np.maximum(u, v)
        keys = pair_keys(u, v, num_nodes)[u != v]
        keys = keys[~is_in_sorted(keys, forbidden)]
        if distinct:
            keys = _first_occurrences(keys, kept)
        kept = np.concatenate([kept, keys[:missing]])
    return np.stack([kept // num_nodes, kept % num_nodes])


def is_in_sorted(keys, ordered):
    """Whether each key is in the sorted array `ordered`: a binary search per key (np.isin
    sorts both arrays on every call; this takes 0.6 of its time on an epoch's draw
    against Cora's edges)."""
    if ordered.size == 0:
        return np.zeros(keys.shape, dtype=bool)
    at = np.minimum(np.searchsorted(ordered, keys), ordered.size - 1)
    return ordered[at] == keys


def _first_occurrences(keys, earlier):
    """`keys` without those in `earlier` and without repeats, in their order."""
    keys = keys[~np.isin(keys, earlier)]
    _, first = np.unique(keys, return_index=True)
    return keys[np.sort(first)]


class NegativeSampler:
    """Training negatives for link prediction over `graph` (the message-passing graph):
    `sample(count, epoch)` gives (2, count) int64 pairs that are neither edges of `graph`
    nor self pairs. `undirected` (default: whether every edge has its reverse) draws
    unordered pairs, written u < v. `seed` is the Philox key: an int in [0, 2**64), or
    None for the next of the keys dropouts draw theirs from."""

    def __init__(self, graph, seed=None, undirected=None):
        from ngnn.graph import Graph
        if not isinstance(graph, Graph):
            raise TypeError(f"NegativeSampler: expected an ng.Graph, got {graph!r}")
        if graph.num_nodes < 2:
            raise ValueError(f"NegativeSampler: a graph of {graph.num_nodes} node(s) has no "
                             "pair of distinct vertices to draw")
        self.graph = graph
        self.num_nodes = graph.num_nodes
        self.undirected = is_undirected(graph) if undirected is None else bool(undirected)
        self.forbidden = edge_set(graph, self.undirected)
        if seed is not None and (isinstance(seed, bool) or not isinstance(
                seed, numbers.Integral) or not 0 <= seed < 2 ** 64):
            raise ValueError(f"NegativeSampler: seed must be an int in [0, 2**64) or None, "
                             f"got {seed!r}")
        self.seed = dropout_seed(None if seed is None else int(seed))

    def sample(self, count, epoch=0):
        """`count` pairs for `epoch` (the Philox stream): the same ones on every call with
        the same arguments, fresh ones for every epoch."""
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(f"NegativeSampler.sample: count must be an int >= 0, got "
                             f"{count!r}")
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or \
                not 0 <= epoch < SPLIT_STREAM:
            raise ValueError(f"NegativeSampler.sample: epoch must be an int in [0, 2**62), "
                             f"got {epoch!r}")
        return draw_non_edges(self.seed, int(epoch), count, self.num_nodes, self.forbidden,
                              self.undirected, distinct=False, what="NegativeSampler.sample")

    def __repr__(self):
        kind = "undirected" if self.undirected else "directed"
        return (f"NegativeSampler({kind}, {self.num_nodes} nodes, {self.forbidden.size} "
                f"edges, seed={self.seed})")
