"""Reproducible randomness: the Philox keys of the ops that draw random numbers.

A dropout mask is a pure function of its op's key (`seed`), the call number and the
element's position (ngnn/philox.py), so fixing the keys fixes every mask. An op built
without an explicit seed takes `next_seed()`, the next key of one process-wide stream;
`manual_seed(s)` restarts that stream from `s`, so everything built after it draws masks
fixed by `s`, as `torch.manual_seed` fixes PyTorch's:

    ng.manual_seed(0)
    a = nn.GAT(...)(g, x, training=True)      # its dropouts take keys 0, 1, 2, ... of seed 0
    ng.manual_seed(0)
    b = nn.GAT(...)(g, x, training=True)      # the same keys: the same masks and losses

Anything else that draws random numbers inside a computation (sampled negatives, say)
takes its key from `next_seed()` in the same way. Key k of seed s is word k of
`np.random.SeedSequence(s).generate_state`: well mixed, so nearby seeds give unrelated
keys, and the same words `Trainer(seed=s)` gives the dropouts of the graph it builds
(`keys`, used by ngnn.op_graph.seed_dropout). A process starts as after `manual_seed(0)`.
"""
import numbers
import threading

import numpy as np

_lock = threading.Lock()
_seed = 0
_taken = 0                  # keys of the stream handed out since it started
_buffer = np.zeros(0, dtype=np.uint64)


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or \
            not 0 <= seed < 2 ** 64:
        raise ValueError(f"manual_seed: seed must be an int in [0, 2**64), got {seed!r}")
    return int(seed)


def keys(seed, count):
    """The first `count` keys of the stream of `seed` (uint64)."""
    return np.random.SeedSequence(_check_seed(seed)).generate_state(count, dtype=np.uint64)


def manual_seed(seed):
    """Restarts the key stream at `seed` (an int in [0, 2**64)): the dropout masks of
    everything built after this call are fixed by it."""
    global _seed, _taken, _buffer
    seed = _check_seed(seed)
    with _lock:
        _seed, _taken, _buffer = seed, 0, np.zeros(0, dtype=np.uint64)


def next_seed():
    """The next key of the stream (an int in [0, 2**64)), for an op that draws random
    numbers and was given no seed of its own."""
    global _taken, _buffer
    with _lock:
        if _taken == len(_buffer):
            # Keys are words of one SeedSequence state, generated in doubling runs (the
            # first words of a longer run are the shorter run's).
            _buffer = keys(_seed, max(64, 2 * len(_buffer)))
        key = int(_buffer[_taken])
        _taken += 1
    return key
