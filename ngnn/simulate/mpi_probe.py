"""Run by `ngnn calibrate` as `mpiexec -n 2 python -m ngnn.simulate.mpi_probe`: measures
the link between 2 ranks on this machine as the distributed trainer uses it (nonblocking
sends and receives completed by ngnn.distributed.exchange.wait) and prints one JSON line
on rank 0: `latency` (seconds per message, a 1-element ping-pong, half a round trip),
`bandwidth` (bytes/s of 8 MiB messages, both ways at once as the exchange posts them),
`allreduce_latency` (a 1-element all-reduce) and `allreduce_bandwidth`, and `contention`
(how much slower calibration's kernels run on rank 0 while rank 1 runs them too than
alone: both ranks share this machine's memory and its last-level cache; the fastest of
several turns of each)."""
import json
import sys
import time

import numpy as np

KERNEL_CALLS = 3      # calls of a kernel per timing


def calibration_kernels(quick, rng):
    """{name: function}: calibration's primitives at a GNN layer's width (16 floats), at
    the sizes calibration measures them: random-row gathers and CSR products over the
    columns of an R-MAT graph's in-CSR (a table of 100,000 and one of 500,000 rows), rows
    in order, a narrow matrix product and its weight gradient, exp, dropout keep bits."""
    from ngnn import philox
    from ngnn.simulate.calibration import FUNCTION_SIZES, graph_sizes, rmat_block
    from ngnn.transformers.numpy import kernels as K
    width = 16
    kernels = {}
    _, tables, edges = graph_sizes(quick)
    for rows in tables:
        indptr, cols = rmat_block(rows, edges, seed=1)
        x = rng.standard_normal((rows, width), dtype=np.float32)
        gathered = np.empty((len(cols), width), np.float32)
        out = np.empty((len(indptr) - 1, width), np.float32)
        data = np.ones(len(cols), np.float32)
        kernels[f"take {rows}"] = lambda x=x, c=cols, g=gathered: np.take(x, c, axis=0, out=g)
        kernels[f"take_sorted {rows}"] = lambda x=x, c=np.sort(cols), g=gathered: np.take(
            x, c, axis=0, out=g)
        kernels[f"spmm {rows}"] = lambda x=x, o=out, p=indptr, c=cols, d=data: K.csr_product(
            (len(p) - 1, len(x)), p, c, d, x, o)
        weight = rng.standard_normal((width, width), dtype=np.float32)
        product, gradient = np.empty_like(x), np.empty_like(weight)
        kernels[f"matmul {rows}"] = lambda x=x, w=weight, o=product, g=gradient: (
            np.matmul(x, w, out=o), np.matmul(x.T, o, out=g))
    elements = FUNCTION_SIZES[quick][-1]
    values, result = rng.standard_normal(elements, dtype=np.float32), np.empty(elements,
                                                                                np.float32)
    bits = np.empty(elements, np.bool_)
    kernels["exp"] = lambda: np.exp(values, out=result)
    kernels["keep_bits"] = lambda: philox.keep_bits(1, 0, 0.5, bits)
    return kernels


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

    kernels = calibration_kernels(quick, np.random.default_rng(rank))

    def beside(kernel, busy):
        """Rank 0's kernel while rank 1 runs it too (busy) or sleeps until told: not in an
        MPI call, whose polling would hold a core."""
        comm.Barrier()
        if rank == 0:
            start = time.perf_counter()
            for _ in range(KERNEL_CALLS):
                kernel()
            elapsed = time.perf_counter() - start
            comm.Send(np.zeros(1, np.uint8), dest=1, tag=5)
            return elapsed
        flag = np.empty(1, np.uint8)
        request = comm.Irecv(flag, source=0, tag=5)
        while not request.Test():
            if busy:
                kernel()
            else:
                time.sleep(1e-4)
        return 0.0

    # Each kernel alone and side by side in turns, the fastest of each kept, as every
    # calibrated figure is: another job only ever slows a kernel down, and what is
    # measured is what the 2 ranks cost each other, not what the other jobs of the moment
    # cost them. The contention is the kernels' total time side by side over alone.
    alone = {name: float("inf") for name in kernels}
    together = dict(alone)
    for name, kernel in kernels.items():
        beside(kernel, False)
    for _ in range(3):
        for name, kernel in kernels.items():
            alone[name] = min(alone[name], beside(kernel, False))
            together[name] = min(together[name], beside(kernel, True))
    alone, together = sum(alone.values()), sum(together.values())

    if rank == 0:
        print(json.dumps({"latency": latency, "bandwidth": bandwidth,
                          "allreduce_latency": allreduce_latency,
                          "allreduce_bandwidth": allreduce_bandwidth,
                          "contention": max(1.0, together / alone)}),
              flush=True)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
