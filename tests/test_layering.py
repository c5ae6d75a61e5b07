"""Which module may import which: the dependencies the architecture allows only one way
(issue 32's knots), read from the sources' import statements, lazy ones included."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def imported_modules(path):
    """The ngnn modules `path` imports (absolute names), at any depth of its code."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "transformers":
        parts = ["ngnn"] + parts
    package = parts[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("folder, forbidden", [
    ("ngnn/sampling", "ngnn.train"),                   # train builds on sampling
    ("ngnn/op_graph", "ngnn.train"),
    ("transformers/base.py", "ngnn.out_of_core"),      # out-of-core plugs into the base
])
def test_a_lower_layer_does_not_import_a_higher_one(folder, forbidden):
    path = ROOT / folder
    files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    assert files
    offending = {str(f.relative_to(ROOT)): sorted(m for m in imported_modules(f)
                                                   if m == forbidden or
                                                   m.startswith(forbidden + "."))
                 for f in files}
    assert not {f: m for f, m in offending.items() if m}


def test_chunked_execution_is_plugged_into_the_base_transformer():
    from ngnn.out_of_core import ChunkedProgram
    from ngnn.transformers.base import Computation
    assert Computation.chunked_program is ChunkedProgram
