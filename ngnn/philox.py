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
* A random float for 64-bit `seed`, 64-bit `counter` and 32-bit `stream`:
  key = (seed & 0xFFFFFFFF, seed >> 32),
  counter words = (counter & 0xFFFFFFFF, counter >> 32, stream, 0),
  float = (first output word >> 8) * 2**-24, which lies in [0, 1) and is exact in float32.
* `uniform(seed, counter_start, n, stream)` gives element i the counter (counter_start + i) mod 2**64,
  so a kernel that adds its thread index to a base counter (carrying into the high word, as
  `philox_uniform_at` in the prelude does) reproduces the array.
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
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in counter)
    k0, k1 = (int(k) & MASK32 for k in key)
    for _ in range(ROUNDS):
        # 32x32 -> 64-bit products need uint64 so nothing wraps before the high half is taken.
        p0 = np.uint64(M0) * c0.astype(np.uint64)
        p1 = np.uint64(M1) * c2.astype(np.uint64)
        hi0 = (p0 >> np.uint64(32)).astype(np.uint32)
        lo0 = (p0 & np.uint64(MASK32)).astype(np.uint32)
        hi1 = (p1 >> np.uint64(32)).astype(np.uint32)
        lo1 = (p1 & np.uint64(MASK32)).astype(np.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint32(k0), lo1, hi0 ^ c3 ^ np.uint32(k1), lo0
        # Python ints for the key so the mod-2**32 wrap is explicit rather than an overflow warning.
        k0 = (k0 + W0) & MASK32
        k1 = (k1 + W1) & MASK32
    return c0, c1, c2, c3


def _check_range(name, value, bits):
    value = int(value)
    if not 0 <= value < 2 ** bits:
        raise ValueError(f"{name} must be in [0, 2**{bits}), got {value}")
    return value


def uniform(seed, counter_start, n, stream=0):
    """float32 array of `n` uniform numbers in [0, 1): element i is the Philox float for
    (`seed`, counter `counter_start + i`, `stream`) as defined in the module docstring."""
    seed = _check_range("seed", seed, 64)
    counter_start = _check_range("counter_start", counter_start, 64)
    stream = _check_range("stream", stream, 32)
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    # uint64 addition wraps mod 2**64, matching the device's 64-bit counter with carry.
    return uniform_at(seed, np.uint64(counter_start) + np.arange(n, dtype=np.uint64), stream)


def uniform_at(seed, counters, stream=0):
    """Like `uniform`, for any array of 64-bit counters (a fused kernel draws the numbers of
    one block of a tensor: counters = base + the flat indices of its elements)."""
    seed = _check_range("seed", seed, 64)
    stream = _check_range("stream", stream, 32)
    counters = np.asarray(counters, dtype=np.uint64)
    lo = (counters & np.uint64(MASK32)).astype(np.uint32)
    hi = (counters >> np.uint64(32)).astype(np.uint32)
    zeros = np.zeros(counters.shape, np.uint32)
    words = philox4x32_10((lo, hi, zeros + np.uint32(stream), zeros),
                          (seed & MASK32, seed >> 32))
    return ((words[0] >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)
