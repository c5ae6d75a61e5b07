"""Checks that the ngnn this Python imports is an installed copy, whole: run by
scripts/check_wheel.sh with a fresh venv's Python, from a folder outside the checkout.

    python check_installed.py CHECKOUT

It fails (exit 1, naming what is wrong) when ngnn is imported from anywhere but this
environment's prefix (the editable checkout would hide a broken package), when a module or
package file of the checkout is missing from the installed copy, when a module does not
import, or when a template or an embedded data file did not ship.
"""
import importlib
import pathlib
import pkgutil
import sys

# The checkout's top-level folders and where each lands once installed (setup.py's
# package_dir maps the last two into the ngnn namespace).
INSTALLED_AS = {"ngnn": "ngnn", "transformers": "ngnn/transformers",
                "templates": "ngnn/templates"}


def checkout_files(checkout):
    """Every .py, .j2 and embedded data file of the checkout, as its path once installed."""
    files = set()
    for folder, installed in INSTALLED_AS.items():
        root = checkout / folder
        for path in root.rglob("*"):
            relative = path.relative_to(root)
            if not path.is_file() or "__pycache__" in relative.parts:
                continue
            if folder == "ngnn" and relative.parts[0] in ("transformers", "templates"):
                continue                      # a development checkout's links to the two above
            if path.suffix in (".py", ".j2") or relative.parts[:2] == ("datasets", "data"):
                files.add(f"{installed}/{relative.as_posix()}")
    return files


def main(checkout):
    import ngnn
    installed_root = pathlib.Path(ngnn.__file__).resolve().parent
    if not installed_root.is_relative_to(pathlib.Path(sys.prefix).resolve()):
        sys.exit(f"check_installed: ngnn is imported from {installed_root}, not from the "
                 f"environment at {sys.prefix}: the check would test the checkout")
    site = installed_root.parent
    installed = {p.relative_to(site).as_posix() for p in installed_root.rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    missing = sorted(checkout_files(checkout) - installed)
    if missing:
        sys.exit("check_installed: missing from the installed ngnn:\n  " + "\n  ".join(missing))
    failed = []
    modules = list(pkgutil.walk_packages(ngnn.__path__, "ngnn.", onerror=failed.append))
    for module in modules:
        try:
            importlib.import_module(module.name)
        except Exception as error:               # every failure listed, not only the first
            failed.append(f"{module.name}: {type(error).__name__}: {error}")
    if failed:
        sys.exit("check_installed: these do not import:\n  " + "\n  ".join(map(str, failed)))
    elsewhere = sorted(
        name for name, module in sys.modules.items()
        if name.split(".")[0] == "ngnn" and getattr(module, "__file__", None)
        and not pathlib.Path(module.__file__).resolve().is_relative_to(installed_root))
    if elsewhere:
        sys.exit("check_installed: these ngnn modules come from outside the installed copy "
                 "(an editable install's import hook?):\n  " + "\n  ".join(elsewhere))
    print(f"check_installed: ngnn at {installed_root}: {len(modules)} modules import, "
          f"{len(installed)} files, none of the checkout's missing")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]).resolve())
