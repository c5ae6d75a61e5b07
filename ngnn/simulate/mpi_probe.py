"""Run by `ngnn calibrate` as `mpiexec -n 2 python -m ngnn.simulate.mpi_probe`: measures
the link between 2 ranks on this machine as the distributed trainer uses it (nonblocking
sends and receives completed by ngnn.distributed.exchange.wait) and prints one JSON line
on rank 0: `latency` (seconds per message, a 1-element ping-pong, half a round trip),
`bandwidth` (bytes/s of 8 MiB messages, both ways at once as the exchange posts them),
`allreduce_latency` (a 1-element all-reduce) and `allreduce_bandwidth`, and `contention`
(how much slower a step's mix in small, random-row gathers and a layer's narrow matrix
products, runs on rank 0 while rank 1 runs it too than alone: both ranks share this
machine's memory and cores; the fastest of several turns of each)."""
import json
import sys
import time

import numpy as np

# The contention loop lasts about as long as a short training step (a tenth of a second).
MIX_ROUNDS = 12


def best(run, repeats, comm):
    run()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(quick=False):
    from mpi4py import MPI
    try:     # the trainer's own way of waiting, when it has one
        from ngnn.distributed.exchange import wait
    except ImportError:
        wait = MPI.Request.Waitall
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    peer = 1 - rank
    repeats = 5 if quick else 20

    def swap(send, receive):
        wait([comm.Irecv(receive, source=peer, tag=3), comm.Isend(send, dest=peer, tag=3)])

    small, small_in = np.zeros(1, np.float32), np.zeros(1, np.float32)
    latency = best(lambda: swap(small, small_in), repeats, comm)
    size = (1 << 20) if quick else (8 << 20)
    big, big_in = np.ones(size // 4, np.float32), np.empty(size // 4, np.float32)
    bandwidth = size / max(best(lambda: swap(big, big_in), max(3, repeats // 4), comm)
                           - latency, 1e-9)
    reduced_small = np.empty_like(small)
    allreduce_latency = best(lambda: wait([comm.Iallreduce(small, reduced_small,
                                                           op=MPI.SUM)]), repeats, comm)
    reduced = np.empty_like(big)
    allreduce = best(lambda: wait([comm.Iallreduce(big, reduced, op=MPI.SUM)]),
                     max(3, repeats // 4), comm)
    allreduce_bandwidth = size / max(allreduce - allreduce_latency, 1e-9)

    # A step's mix in small: random-row gathers, a narrow matrix product and its weight
    # gradient (BLAS, whose threads each rank starts and which spin after each call).
    rng = np.random.default_rng(rank)
    table = rng.standard_normal((200_000 if not quick else 20_000, 16), dtype=np.float32)
    index = rng.integers(0, len(table), 2 * len(table))
    out = np.empty((len(index), 16), np.float32)
    weight = rng.standard_normal((16, 4), dtype=np.float32)
    product, gradient = np.empty((len(table), 4), np.float32), np.empty_like(weight)

    def mix():
        for _ in range(MIX_ROUNDS if not quick else 3):
            np.take(table, index, axis=0, out=out)
            np.matmul(table, weight, out=product)
            np.matmul(table.T, product, out=gradient)

    def beside(busy):
        """Rank 0's mix while rank 1 runs it too (busy) or sleeps until told: not in an MPI
        call, whose polling would hold a core."""
        comm.Barrier()
        if rank == 0:
            start = time.perf_counter()
            mix()
            elapsed = time.perf_counter() - start
            comm.Send(np.zeros(1, np.uint8), dest=1, tag=5)
            return elapsed
        flag = np.empty(1, np.uint8)
        request = comm.Irecv(flag, source=0, tag=5)
        while not request.Test():
            if busy:
                mix()
            else:
                time.sleep(1e-4)
        return 0.0

    beside(False)
    # Alone and side by side in turns, the fastest of each kept, as every calibrated
    # figure is: another job only ever slows a loop down, and what is measured is what
    # the 2 ranks cost each other, not what the other jobs of the moment cost them.
    alone, together = float("inf"), float("inf")
    for _ in range(max(3, repeats // 4)):
        alone = min(alone, beside(False))
        together = min(together, beside(True))
    if rank == 0:
        print(json.dumps({"latency": latency, "bandwidth": bandwidth,
                          "allreduce_latency": allreduce_latency,
                          "allreduce_bandwidth": allreduce_bandwidth,
                          "contention": max(1.0, together / alone)}),
              flush=True)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
