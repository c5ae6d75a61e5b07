"""Train/validation/test splits of a graph's edges for link prediction.

    split = datasets.link_split(data, val=0.05, test=0.1, seed=0)
    split.graph                  # message passing: no validation or test edge, either way
    split.train_pos, split.val_pos, split.val_neg, split.test_pos, split.test_neg

The links are the graph's distinct vertex pairs u != v (in an undirected graph, one per
unordered pair, written u < v; self loops and parallel edges are no links of their own).
A Philox draw (ngnn.philox, key `seed`) orders them; the first share `val` are validation
links, the next `test` test links, the rest training links. The message-passing graph is
the input graph without every edge of a held-out link, in both directions when the graph
is undirected: an encoder that could see a held-out edge would find it (the leak
PyG's RandomLinkSplit users report when an undirected graph is split as a directed one).
Validation and test negatives are distinct pairs that are no edge of the whole graph,
disjoint from each other; training negatives are drawn anew each epoch
(ngnn.sampling.NegativeSampler) against the message-passing graph only, since the
held-out edges are unknown at training time.
"""
import dataclasses
import numbers

import numpy as np

from ngnn import philox
from ngnn.graph import Graph
from ngnn.sampling.negative import (SPLIT_STREAM, draw_non_edges, edge_set, is_undirected,
                                    pair_keys)

ORDER_STREAM = SPLIT_STREAM            # the order of the links
NEGATIVE_STREAM = SPLIT_STREAM + 1     # validation and test negatives, drawn together


@dataclasses.dataclass(frozen=True)
class LinkSplit:
    """The pairs of a link-prediction split, each a (2, k) int64 array of (u, v) rows;
    `graph` is the message-passing graph and `data` the dataset split (None when a bare
    graph was)."""

    graph: Graph
    train_pos: np.ndarray
    val_pos: np.ndarray
    val_neg: np.ndarray
    test_pos: np.ndarray
    test_neg: np.ndarray
    undirected: bool
    data: object = None

    @property
    def num_nodes(self):
        return self.graph.num_nodes

    def summary(self):
        kind = "undirected" if self.undirected else "directed"
        return (f"link split ({kind}): {self.train_pos.shape[1]} training links, "
                f"{self.val_pos.shape[1]} + {self.val_neg.shape[1]} validation, "
                f"{self.test_pos.shape[1]} + {self.test_neg.shape[1]} test pairs (positive + "
                f"negative); message passing over {self.graph.num_edges} edges")


def _share(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            not np.isfinite(value) or not 0 <= value < 1:
        raise ValueError(f"link_split: {name} must be a share of the links in [0, 1), got "
                         f"{value!r}")
    return float(value)


def link_split(data, val=0.05, test=0.1, seed=0, neg_ratio=1.0, undirected=None):
    """Splits the links of `data` (a datasets.Dataset or an ng.Graph) into training,
    validation (share `val`) and test (share `test`) links, with `neg_ratio` negative pairs
    per validation and test link; returns a LinkSplit. `undirected` (default: whether every
    edge has its reverse) treats u -> v and v -> u as one link. `seed` (an int in
    [0, 2**64)) fixes every draw."""
    graph = getattr(data, "graph", data)
    if not isinstance(graph, Graph):
        raise TypeError(f"link_split: expected a datasets.Dataset or an ng.Graph, got "
                        f"{data!r}")
    val, test = _share("val", val), _share("test", test)
    if val + test >= 1:
        raise ValueError(f"link_split: val + test must be below 1 (some links must be left to "
                         f"train on), got val={val} + test={test} = {val + test}")
    if isinstance(neg_ratio, bool) or not isinstance(neg_ratio, numbers.Real) or \
            not np.isfinite(neg_ratio) or neg_ratio < 0:
        raise ValueError(f"link_split: neg_ratio (negative pairs per positive) must be a "
                         f"finite number >= 0, got {neg_ratio!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or \
            not 0 <= seed < 2 ** 64:
        raise ValueError(f"link_split: seed must be an int in [0, 2**64), got {seed!r}")
    if graph.is_block or graph.varies:
        raise ValueError(f"link_split: {graph!r} is a block or a slot; split a whole graph")
    undirected = is_undirected(graph) if undirected is None else bool(undirected)
    n = graph.num_nodes

    links = edge_set(graph, undirected)                 # sorted keys, self loops included
    links = links[links // n != links % n] if n else links
    order = np.argsort(philox.words(int(seed), 0, links.size, ORDER_STREAM), kind="stable")
    num_val, num_test = int(val * links.size), int(test * links.size)
    for name, share, count in (("val", val, num_val), ("test", test, num_test)):
        if share > 0 and count == 0:
            raise ValueError(f"link_split: {name}={share} of the graph's {links.size} links "
                             f"is no link at all; raise {name} or pass {name}=0")
    if links.size - num_val - num_test == 0:
        raise ValueError(f"link_split: no training link is left of the graph's {links.size}")
    val_keys = links[order[:num_val]]
    test_keys = links[order[num_val:num_val + num_test]]
    train_keys = np.sort(links[order[num_val + num_test:]])

    held_out = np.concatenate([val_keys, test_keys])
    src, dst = graph.src, graph.dst
    edge_keys = pair_keys(np.minimum(src, dst), np.maximum(src, dst), n) if undirected else \
        pair_keys(src, dst, n)
    keep = ~np.isin(edge_keys, held_out)
    message_passing = Graph(src[keep], dst[keep], n)

    num_val_neg = int(round(neg_ratio * num_val))
    num_test_neg = int(round(neg_ratio * num_test))
    negatives = draw_non_edges(int(seed), NEGATIVE_STREAM, num_val_neg + num_test_neg, n,
                               edge_set(graph, undirected), undirected, distinct=True,
                               what="link_split: validation and test negatives")

    def pairs(keys):
        return np.stack([keys // n, keys % n]).astype(np.int64)

    return LinkSplit(graph=message_passing, train_pos=pairs(train_keys),
                     val_pos=pairs(val_keys), val_neg=negatives[:, :num_val_neg],
                     test_pos=pairs(test_keys), test_neg=negatives[:, num_val_neg:],
                     undirected=undirected, data=None if data is graph else data)
