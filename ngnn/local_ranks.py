"""MPI ranks on one host share its cores: each rank's BLAS gets its share of threads.

OpenBLAS starts as many threads as the machine has cores, in every process. Two ranks on
two cores then run four BLAS threads that preempt each other (and the peer rank waiting
in an exchange). Under mpiexec (MPICH's hydra says how many ranks share this host in
MPI_LOCALNRANKS, Open MPI in OMPI_COMM_WORLD_LOCAL_SIZE) each rank gets the cores it may
run on divided by the local ranks, at least 1, unless the user set the variables.
OpenBLAS reads them once, when NumPy loads it, so this runs when ngnn is imported,
before NumPy is: `ngnn` on the command line, or a script that imports ngnn before NumPy
(set OPENBLAS_NUM_THREADS yourself otherwise).
"""
import os

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")   # MPICH, Open MPI


def share_cores(environ=os.environ):
    """Sets the BLAS thread counts for this rank; returns the count, or None when one
    rank runs on this host."""
    try:
        local = max(int(environ.get(name, "1")) for name in LOCAL_SIZE_VARIABLES)
    except ValueError:
        return None
    if local <= 1:
        return None
    threads = max(1, len(os.sched_getaffinity(0)) // local)
    for name in THREAD_VARIABLES:
        environ.setdefault(name, str(threads))
    return threads
