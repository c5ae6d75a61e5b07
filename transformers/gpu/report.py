"""What a GPU computation's kernels did: `GPUComputation.kernel_report()`.

One row per kernel, in launch order, from the kernel plan (template, fused group, global
bytes), the prepared launches (count, work-groups, device time of the last call) and the
edge schedule the kernel's loops follow (edges per work-group).
"""
import numpy as np


def edges_per_work_group(kernel):
    """The edges each work-group of one launch of `kernel` walks (an int64 array, one entry
    per work-group), or None for a kernel without an edge loop: the kernel's edge schedule
    says (GPUKernel.edges_per_work_group, transformers/gpu/schedule.py)."""
    walked = kernel.edges_per_work_group()
    return walked if walked.size else None


def kernel_report(executor):
    """The rows of GPUComputation.kernel_report for a bound executor (GPUKernelGroup)."""
    launched = {}
    for kernel, launch in executor.launches:
        launched.setdefault(kernel, []).append(launch)
    rows = []
    for kernel in executor.kernels:
        launches = launched.get(kernel, [])
        groups = int(np.prod([g // s for g, s in zip(kernel.global_size, kernel.local_size)],
                             dtype=np.int64))
        edges = edges_per_work_group(kernel)
        times = [launch.seconds() for launch in launches] if executor.called else [None]
        rows.append({
            "name": kernel.name, "values": kernel.values, "template": kernel.template,
            "group": executor.groups.get(kernel.op),
            "launches": len(launches), "work_groups": groups * len(launches),
            "max_edges": None if edges is None else int(edges.max(initial=0)),
            "mean_edges": None if edges is None else float(edges.mean()) if edges.size else 0.0,
            "global_bytes": kernel.global_bytes() * len(launches),
            "seconds": None if None in times else float(sum(times)),
        })
    return rows
