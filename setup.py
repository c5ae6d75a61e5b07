"""ngnn: a compiler for graph neural networks.

`transformers/` is installed as `ngnn.transformers` (never as a top-level package: that
name belongs to another library) and `templates/` as `ngnn.templates` package data.
"""
from setuptools import setup

CORE_PACKAGES = ["ngnn", "ngnn.op_graph", "ngnn.passes", "ngnn.frontend", "ngnn.nn",
                 "ngnn.datasets", "ngnn.sampling", "ngnn.distributed"]

setup(
    name="ngnn",
    version="0.1.0",
    description="A compiler for graph neural networks: vertex-centric front end, graph IR, "
                "fused kernels for NumPy, CUDA and OpenCL",
    python_requires=">=3.10",
    packages=CORE_PACKAGES + ["ngnn.transformers", "ngnn.transformers.numpy",
                              "ngnn.transformers.gpu", "ngnn.transformers.gpu.runtime",
                              "ngnn.templates"],
    package_dir={"ngnn.transformers": "transformers", "ngnn.templates": "templates"},
    package_data={"ngnn.templates": ["*.j2"], "ngnn.datasets": ["data/*.npz", "data/tu/*.npz"]},
    install_requires=["numpy>=1.24", "scipy>=1.10", "jinja2>=3.0", "multipledispatch>=0.6",
                      "tqdm>=4.60"],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "networkx>=2.8"],
        "opencl": ["pyopencl>=2022.1"],
        "cuda": ["pycuda>=2022.1"],
        "mpi": ["mpi4py>=3.1", "mpich", "pymetis>=2023.1"],
        # Pictures of the IR (Graphviz's `dot` program too: Debian package graphviz) and
        # plots of training and benchmarks.
        "viz": ["graphviz>=0.20", "matplotlib>=3.7"],
        # The documentation site: mkdocs build --strict over docs/.
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26"],
    },
    entry_points={"console_scripts": ["ngnn=ngnn.cli:main"]},
)
