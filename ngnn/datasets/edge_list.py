"""Reading a graph from a text edge list ("src dst" per line)."""

import io
import warnings

import numpy as np

from ngnn.graph import Graph


def _locate_bad_line(path, text, comments):
    """Raises a ValueError naming the first malformed line; only run after a fast parse failed."""
    for number, line in enumerate(text.splitlines(), start=1):
        if comments:
            line = line.split(comments, 1)[0]
        tokens = line.replace(",", " ").split()
        if not tokens:
            continue
        if len(tokens) != 2:
            raise ValueError(
                f"{path}, line {number}: expected 2 columns 'src dst', got {len(tokens)}: {line.strip()!r}")
        for token in tokens:
            try:
                int(token)
            except ValueError:
                raise ValueError(
                    f"{path}, line {number}: {token!r} is not an integer node id") from None


def load_edge_list(path, num_nodes=None, comments="#"):
    """Graph from a text file with one edge "src dst" per line, split by whitespace or a comma.

    Text after ``comments`` and blank lines are ignored. ``num_nodes`` defaults to max id + 1.
    """
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        with warnings.catch_warnings():
            # An edge list with no edges is valid; loadtxt would only warn that it is empty.
            warnings.simplefilter("ignore", UserWarning)
            table = np.loadtxt(io.StringIO(text.replace(",", " ")), dtype=np.int64,
                               comments=comments, ndmin=2)
    except ValueError as err:
        _locate_bad_line(path, text, comments)
        raise ValueError(f"{path}: cannot parse edge list ({err})") from err
    if table.size and table.shape[1] != 2:
        _locate_bad_line(path, text, comments)
    if table.size == 0:
        table = np.zeros((0, 2), dtype=np.int64)
    try:
        return Graph.from_edges(table[:, 0], table[:, 1], num_nodes=num_nodes)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
