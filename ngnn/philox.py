"""Philox4x32-10 counter-based random numbers, bit-exact with the device prelude.

GPU kernels draw random numbers (dropout masks, sampling) with the `philox_uniform` function of
templates/prelude.j2; this module computes the same numbers with NumPy so the NumPy transformer,
the tests and the GPU kernels agree bit for bit. Both sides follow this definition:

* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) on a
  counter of four 32-bit words (c0, c1, c2, c3) and a key of two 32-bit words (k0, k1).
  One round, with multipliers M0 = 0xD2511F53 and M1 = 0xCD9E8D57 and 32x32 -> 64-bit products:

      hi0:lo0 = M0 * c0        hi1:lo1 = M1 * c2
      (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

  then the key is bumped by the Weyl constants: k0 += 0x9E3779B9, k1 += 0xBB67AE85 (mod 2**32).
  Ten rounds; the four counter words after the last round are the output.
* A random float for 64-bit `seed`, 64-bit position `p` and 32-bit `stream`: one Philox call
  gives four words, so four consecutive positions share one counter and each takes one word:
  key = (seed & 0xFFFFFFFF, seed >> 32), c = p >> 2,
  counter words = (c & 0xFFFFFFFF, c >> 32, stream, 0),
  float = (output word number p & 3, shifted right by 8) * 2**-24, which lies in [0, 1) and
  is exact in float32.
* `uniform(seed, start, n, stream)` gives element i the position (start + i) mod 2**64, so a
  kernel that adds its thread index to a base position (carrying into the high word, as
  `philox_uniform_at` in the prelude does) reproduces the array. The host computes each
  counter once for its four positions; a device thread computes the counter of its own
  position and keeps one word, trading three discarded words for no communication.
"""
import numpy as np

M0 = 0xD2511F53
M1 = 0xCD9E8D57
W0 = 0x9E3779B9
W1 = 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    """Apply Philox4x32-10 to counter words `counter` (four uint32 arrays of one shape, or ints)
    under `key` (two ints). Returns the four output words as uint32 arrays."""
    words = [np.asarray(c, dtype=np.uint32) for c in counter]
    shape = np.broadcast_shapes(*(w.shape for w in words))
    # The words live in uint64 arrays holding 32-bit values: a 32x32-bit product then fits
    # without wrapping, and every step below works in place (dropout masks of millions of
    # elements spend their time here).
    c0, c1, c2, c3 = (np.array(np.broadcast_to(w, shape), dtype=np.uint64) for w in words)
    spare = np.empty(shape, np.uint64)
    m0, m1, mask, s32 = np.uint64(M0), np.uint64(M1), np.uint64(MASK32), np.uint64(32)
    k0, k1 = (int(k) & MASK32 for k in key)
    for _ in range(ROUNDS):
        p0, p1 = c0, c2
        p0 *= m0
        p1 *= m1
        new0 = np.right_shift(p1, s32, out=spare)      # hi1 ^ c1 ^ k0
        new0 ^= c1
        new0 ^= np.uint64(k0)
        new2 = np.right_shift(p0, s32, out=c1)         # hi0 ^ c3 ^ k1 (c1 is used up)
        new2 ^= c3
        new2 ^= np.uint64(k1)
        p1 &= mask                                     # lo1
        p0 &= mask                                     # lo0
        spare = c3
        c0, c1, c2, c3 = new0, p1, new2, p0
        # Python ints for the key so the mod-2**32 wrap is explicit rather than an overflow warning.
        k0 = (k0 + W0) & MASK32
        k1 = (k1 + W1) & MASK32
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def _check_range(name, value, bits):
    value = int(value)
    if not 0 <= value < 2 ** bits:
        raise ValueError(f"{name} must be in [0, 2**{bits}), got {value}")
    return value


def uniform(seed, start, n, stream=0):
    """float32 array of `n` uniform numbers in [0, 1): element i is the Philox float for
    (`seed`, position `start + i`, `stream`) as defined in the module docstring."""
    seed = _check_range("seed", seed, 64)
    start = _check_range("start", start, 64)
    stream = _check_range("stream", stream, 32)
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if start + n > 2 ** 64:      # positions wrap around: no run of whole counters to share
        return uniform_at(seed, np.uint64(start) + np.arange(n, dtype=np.uint64), stream)
    first, last = start >> 2, (start + n + 3) >> 2
    out = np.empty((last - first, 4), np.float32)      # row c - first: counter c's words
    for block in range(first, last, BLOCK):
        counters = np.arange(block, min(block + BLOCK, last), dtype=np.uint64)
        np.stack(_words(seed, counters, stream), axis=-1,
                 out=out[block - first:block - first + len(counters)])
    offset = start & 3
    return out.reshape(-1)[offset:offset + n]


# Counters per pass: the round's working arrays then stay in cache, which halves the time
# of a dropout mask of millions of elements.
BLOCK = 1 << 14


def _words(seed, counters, stream):
    """The four outputs of Philox at `counters` (uint64) turned into floats in [0, 1)."""
    lo = (counters & np.uint64(MASK32)).astype(np.uint32)
    hi = (counters >> np.uint64(32)).astype(np.uint32)
    words = philox4x32_10((lo, hi, np.uint32(stream), np.uint32(0)),
                          (seed & MASK32, seed >> 32))
    return [(w >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24) for w in words]


def uniform_at(seed, positions, stream=0):
    """Like `uniform`, for any array of 64-bit positions (a fused kernel draws the numbers of
    one block of a tensor: positions = base + the flat indices of its elements)."""
    seed = _check_range("seed", seed, 64)
    stream = _check_range("stream", stream, 32)
    positions = np.asarray(positions, dtype=np.uint64)
    flat = positions.reshape(-1)
    out = np.empty(flat.shape, np.float32)
    for start in range(0, flat.shape[0], BLOCK):
        block = flat[start:start + BLOCK]
        words = _words(seed, block >> np.uint64(2), stream)
        np.choose((block & np.uint64(3)).astype(np.intp), words, out=out[start:start + BLOCK])
    return out.reshape(positions.shape)


def uniform_rows(seed, base, rows, width, stream=0):
    """(len(rows), width) float32: element (i, j) is the Philox float at position
    base + rows[i] * width + j, i.e. rows `rows` of uniform(seed, base, n * width) viewed
    as n rows of `width` (a dropout mask keyed by global row ids). When rows start on
    whole counters (base and width multiples of 4), each counter is computed once and its
    four words are the row's next four numbers."""
    rows = np.asarray(rows, dtype=np.uint64).reshape(-1)
    seed = _check_range("seed", seed, 64)
    base = _check_range("base", base, 64)
    width = int(width)
    if width % 4 or base % 4 or width == 0:
        flat = rows[:, None] * np.uint64(width) + np.arange(width, dtype=np.uint64)
        return uniform_at(seed, np.uint64(base) + flat, stream)
    per_row = width // 4
    counters = (np.uint64(base >> 2) + rows[:, None] * np.uint64(per_row) +
                np.arange(per_row, dtype=np.uint64)).reshape(-1)
    out = np.empty((counters.shape[0], 4), np.float32)
    for start in range(0, counters.shape[0], BLOCK):
        block = counters[start:start + BLOCK]
        np.stack(_words(seed, block, stream), axis=-1, out=out[start:start + len(block)])
    return out.reshape(rows.shape[0], width)
