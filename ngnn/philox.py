"""Philox4x64-10 counter-based random numbers, bit-exact with the device prelude.

Dropout masks are a pure function of (seed, call number, position): every backend draws
the same mask, and a mask can be regenerated wherever it is needed instead of being stored.
The NumPy side uses NumPy's own `np.random.Philox` bit generator (C speed) for runs of
consecutive positions, and a vectorized NumPy Philox for scattered positions (the stored
values of a sparse tensor); templates/prelude.j2 computes the same function on the device.

The definition, shared by all three:

* Philox4x64-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) on a
  counter of four 64-bit words and a key of two, exactly as NumPy's `Philox` computes it.
* A 32-bit random word for 64-bit `seed`, position `p` and 64-bit `stream`: one Philox call
  gives four 64-bit words, each split into two 32-bit halves (low half first), so eight
  consecutive positions share one counter: key = (seed, 0), counter = (p >> 3, stream, 0, 0),
  word = half p & 1 of output word (p >> 1) & 3.
* A uniform float in [0, 1) is (word >> 8) * 2**-24, exact in float32.
* Dropout at rate r keeps an element when its float is >= float32(r); that is the same test
  as word >= `keep_threshold(r)`, which is what both sides evaluate. A dropout mask of call
  `step` over a tensor uses stream = step and the element's row-major flat index as the
  position, so element (i, j) of an (N, F) tensor has position i * F + j whether the tensor
  is stored dense or sparse.

NumPy's generator increments its 256-bit counter before each block, so the run starting at
counter c is read from a generator set to c - 1.
"""
import functools
import threading

import numpy as np

M0 = 0xD2E7470EE14C6C93
M1 = 0xCA5A826395121157
W0 = 0x9E3779B97F4A7C15
W1 = 0xBB67AE8584CAA73B
ROUNDS = 10
MASK64 = (1 << 64) - 1
_LOW = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
# Positions per pass of the vectorized Philox: its working arrays then stay in cache.
BLOCK = 1 << 14
# Positions per chunk of a whole-tensor mask (a multiple of 8, whole counters): its words
# stay in cache, and no word array of the tensor's size is ever made.
CHUNK = 1 << 16


def _check_range(name, value, bits):
    value = int(value)
    if not 0 <= value < 2 ** bits:
        raise ValueError(f"{name} must be in [0, 2**{bits}), got {value}")
    return value


def _mulhilo(multiplier, c):
    """(high, low) 64-bit halves of multiplier * c, from 32-bit partial products (NumPy
    has no 128-bit product), reusing the temporaries in place."""
    m_lo, m_hi = np.uint64(multiplier & 0xFFFFFFFF), np.uint64(multiplier >> 32)
    c_lo, c_hi = c & _LOW, c >> _S32
    cross = c_lo * m_hi
    c_lo *= m_lo                     # the low partial product; only its carry matters
    c_lo >>= _S32
    cross += c_lo
    high = c_hi * m_hi
    c_hi *= m_lo                     # the other cross product
    np.bitwise_and(cross, _LOW, out=c_lo)
    c_hi += c_lo
    cross >>= _S32
    high += cross
    c_hi >>= _S32
    high += c_hi
    return high, c * np.uint64(multiplier)


def philox4x64_10(counter, key):
    """Philox4x64-10 of counter words `counter` (four uint64 arrays of one shape, or ints)
    under `key` (two ints); returns the four output words as uint64 arrays."""
    words = [np.asarray(c, dtype=np.uint64) for c in counter]
    shape = np.broadcast_shapes(*(w.shape for w in words))
    # Flat arrays (never 0-d), so every step can work in place.
    c0, c1, c2, c3 = (np.array(np.broadcast_to(w, shape)).reshape(-1) for w in words)
    k0, k1 = (int(k) & MASK64 for k in key)
    with np.errstate(over="ignore"):      # products wrap mod 2**64 by design
        for _ in range(ROUNDS):
            hi0, lo0 = _mulhilo(M0, c0)
            hi1, lo1 = _mulhilo(M1, c2)
            hi1 ^= c1
            hi1 ^= np.uint64(k0)
            hi0 ^= c3
            hi0 ^= np.uint64(k1)
            c0, c1, c2, c3 = hi1, lo1, hi0, lo0
            k0 = (k0 + W0) & MASK64
            k1 = (k1 + W1) & MASK64
    return tuple(c.reshape(shape) for c in (c0, c1, c2, c3))


def words(seed, start, n, stream=0):
    """uint32 words of positions start, ..., start + n - 1, drawn by NumPy's Philox."""
    seed = _check_range("seed", seed, 64)
    start = _check_range("start", start, 64)
    stream = _check_range("stream", stream, 64)
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if start + n > 2 ** 64:
        raise ValueError(f"positions {start} + {n} run past 2**64")
    if n == 0:
        return np.empty(0, np.uint32)
    first, last = start >> 3, (start + n - 1) >> 3
    raw = _generator(seed, first, stream).random_raw(4 * (last - first + 1)).view(np.uint32)
    offset = start & 7
    return raw[offset:offset + n]


def _generator(seed, counter, stream):
    """NumPy's Philox set to give counter (counter, stream, 0, 0) first: it steps its
    256-bit counter before each block, so it starts one behind. One generator per thread
    is reset in place (setting its state costs a tenth of building one, which dominated a
    small mask's draw); its draws are used before the thread asks for the next."""
    previous = (((stream << 64) | counter) - 1) % 2 ** 256
    cached = getattr(_per_thread, "generator", None)
    if cached is None:
        cached = _per_thread.generator = np.random.Philox()
    cached.state = {"bit_generator": "Philox",
                    "state": {"counter": np.array([previous & MASK64,
                                                   (previous >> 64) & MASK64,
                                                   (previous >> 128) & MASK64,
                                                   previous >> 192], dtype=np.uint64),
                              "key": np.array([seed, 0], dtype=np.uint64)},
                    "buffer": _EMPTY_BUFFER, "buffer_pos": 4, "has_uint32": 0,
                    "uinteger": 0}
    return cached


_per_thread = threading.local()
_EMPTY_BUFFER = np.zeros(4, dtype=np.uint64)


def words_at(seed, positions, stream=0):
    """uint32 words at any array of 64-bit positions (the stored values of a sparse tensor,
    the rows of one block of a fused group)."""
    seed = _check_range("seed", seed, 64)
    stream = _check_range("stream", stream, 64)
    positions = np.asarray(positions, dtype=np.uint64)
    flat = positions.reshape(-1)
    out = np.empty(flat.shape, np.uint32)
    for start in range(0, flat.shape[0], BLOCK):
        block = flat[start:start + BLOCK]
        outputs = philox4x64_10((block >> np.uint64(3), stream, 0, 0), (seed, 0))
        word = np.choose(((block >> np.uint64(1)) & np.uint64(3)).astype(np.intp), outputs)
        word >>= (block & np.uint64(1)) * _S32
        out[start:start + BLOCK] = word
    return out.reshape(positions.shape)


def to_uniform(word):
    """Floats in [0, 1) from uint32 words: 24 bits, exact in float32."""
    return (word >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def uniform(seed, start, n, stream=0):
    """float32 array of `n` uniform numbers: element i is the float of position start + i."""
    return to_uniform(words(seed, start, n, stream))


def uniform_at(seed, positions, stream=0):
    """Like `uniform`, at any array of positions."""
    return to_uniform(words_at(seed, positions, stream))


@functools.lru_cache(maxsize=64)
def keep_threshold(rate):
    """The smallest word whose float is >= float32(rate): dropout keeps word >= this."""
    rate = float(np.float32(rate))
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout: rate must be in [0, 1), got {rate}")
    return int(np.ceil(rate * 2.0 ** 24)) << 8


@functools.lru_cache(maxsize=64)
def keep_scale(rate, dtype):
    """The factor kept elements are multiplied by: 1 / (1 - rate) in `dtype`."""
    return np.dtype(dtype).type(1.0 / (1.0 - rate))


def _keep_chunks(seed, stream, rate, size):
    """(start, stop, keep bits) over positions 0 .. size - 1, chunk by chunk, from one
    NumPy Philox generator (counters follow each other)."""
    generator = _generator(seed, 0, stream)
    threshold = np.uint32(keep_threshold(rate))
    for start in range(0, size, CHUNK):
        stop = min(start + CHUNK, size)
        chunk = generator.random_raw(-(-(stop - start) // 8) * 4).view(np.uint32)
        yield start, stop, chunk[:stop - start] >= threshold


def keep_bits(seed, stream, rate, out, start=0):
    """Fills the bool array `out` with the keep bits of the mask over its positions, the
    first being position `start`."""
    flat = out.reshape(-1)
    if start:
        threshold = np.uint32(keep_threshold(rate))
        for low in range(0, flat.size, CHUNK):
            high = min(low + CHUNK, flat.size)
            flat[low:high] = words(seed, start + low, high - low, stream) >= threshold
        return out
    for low, high, keep in _keep_chunks(seed, stream, rate, flat.size):
        flat[low:high] = keep
    return out


def dropout(x, seed, stream, rate, out):
    """out = x * mask, the mask over positions 0 .. out.size - 1 (row-major) of call
    `stream`; `out` (contiguous) may be `x`."""
    if out.size <= CHUNK:       # one draw, no chunk loop: a small mask costs microseconds
        return _apply(_small_keep(seed, stream, rate, out.size).reshape(out.shape), x,
                      rate, out)
    source, target = np.broadcast_to(x, out.shape).reshape(-1), out.reshape(-1)
    for start, stop, keep in _keep_chunks(seed, stream, rate, target.size):
        _apply(keep, source[start:stop], rate, target[start:stop])
    return out


def _small_keep(seed, stream, rate, size):
    """The keep bits of a mask of at most CHUNK positions. The last few are kept: a
    training step draws each forward mask again in its backward pass (RecomputeDropout),
    which then costs a lookup."""
    key = (seed, stream, keep_threshold(rate), size)
    keep = _recent_masks.get(key)
    if keep is None:
        raw = _generator(seed, 0, stream).random_raw(-(-size // 8) * 4)
        keep = raw.view(np.uint32)[:size] >= np.uint32(key[2])
        keep.flags.writeable = False
        with _recent_lock:        # ranks may run as threads
            if len(_recent_masks) >= RECENT_MASKS:
                del _recent_masks[next(iter(_recent_masks))]
            _recent_masks[key] = keep
    return keep


# Small masks kept for their recomputation (at most CHUNK bytes each).
RECENT_MASKS = 16
_recent_masks = {}
_recent_lock = threading.Lock()


def dropout_at(x, seed, stream, rate, positions, out):
    """out = x * mask at the given positions (one per element of x)."""
    keep = words_at(seed, positions, stream).reshape(out.shape) >= \
        np.uint32(keep_threshold(rate))
    return _apply(keep, x, rate, out)


def _apply(keep, x, rate, out):
    """out = x * scale * keep: the arithmetic every backend uses."""
    np.multiply(x, keep_scale(rate, out.dtype), out=out)
    out *= keep
    return out
