"""ngnn: a compiler for graph neural networks.

`transformers/` is installed as `ngnn.transformers` (never as a top-level package: that
name belongs to another library) and `templates/` as `ngnn.templates` package data.
"""
from setuptools import find_packages, setup

# Packages are discovered, never listed: a new folder under ngnn/ or transformers/ with an
# __init__.py ships without touching this file. A development checkout links ngnn/transformers
# and ngnn/templates to the top-level folders; those links are excluded here so the folders
# come in once, through package_dir, as ngnn.transformers and ngnn.templates.
MAPPED = {"ngnn.transformers": "transformers", "ngnn.templates": "templates"}
CORE_PACKAGES = find_packages(include=["ngnn", "ngnn.*"],
                              exclude=[p for name in MAPPED for p in (name, name + ".*")])
TRANSFORMER_PACKAGES = ["ngnn.transformers"] + [
    "ngnn.transformers." + p for p in find_packages(where="transformers")]

setup(
    name="ngnn",
    version="0.1.0",
    description="A compiler for graph neural networks: vertex-centric front end, graph IR, "
                "fused kernels for NumPy, CUDA and OpenCL",
    python_requires=">=3.10",
    packages=CORE_PACKAGES + TRANSFORMER_PACKAGES + ["ngnn.templates"],
    package_dir=MAPPED,
    # Embedded data: every file under ngnn/datasets/data/, at any depth and of any kind
    # (.npz arrays, .txt notices), so a new dataset ships without editing this line.
    package_data={"ngnn.templates": ["*.j2"], "ngnn.datasets": ["data/**/*"]},
    install_requires=["numpy>=1.24", "scipy>=1.10", "jinja2>=3.0", "multipledispatch>=0.6",
                      "tqdm>=4.60"],
    extras_require={
        # torch is pinned: unpinned, pip picks the multi-GB CUDA build; 2.13.0 is the CPU
        # wheel the PyTorch Geometric comparisons were written against. `build` makes the
        # wheel and the sdist that scripts/check_wheel.sh installs.
        "test": ["pytest>=7", "hypothesis>=6", "networkx>=2.8", "torch==2.13.0",
                 "torch_geometric", "build>=1.0"],
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
