"""The documentation site builds with `mkdocs build --strict`: every page, link and API
reference entry resolves."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mkdocs_build_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    for page in ("index.html", "pictures/index.html", "interop/index.html",
                 "reference/graph/index.html", "reference/transformers/index.html"):
        assert (tmp_path / page).is_file(), page
    reference = (tmp_path / "reference/graph/index.html").read_text()
    assert "from_edge_index" in reference        # filled in from the docstrings
