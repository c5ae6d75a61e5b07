"""Identifiers for generated code: user names are sanitized, then made unique."""
import keyword
import re


def sanitize(name, default="t"):
    """A valid Python/C identifier made from `name` (letters, digits, underscores)."""
    ident = re.sub(r"\W", "_", str(name or ""), flags=re.ASCII).strip("_") or default
    if ident[0].isdigit():
        ident = f"{default}_{ident}"
    if keyword.iskeyword(ident) or ident in RESERVED:
        ident += "_"
    return ident


# Names the generated modules and kernels use themselves.
RESERVED = {"np", "scipy", "K", "buffers", "variables", "constants", "graphs", "step", "bind",
            "int", "float", "double", "char", "short", "long", "unsigned", "void", "const",
            "kernel", "global", "local", "gid", "tid", "data", "main", "half", "bool",
            "signed", "struct", "union", "typedef", "sizeof", "restrict", "inline", "static"}


class Namer:
    """Unique sanitized names: `name`, `name_1`, `name_2`, ..."""

    def __init__(self, taken=()):
        self.taken = set(taken)

    def __call__(self, name, default="t"):
        base = sanitize(name, default)
        candidate, n = base, 0
        while candidate in self.taken:
            n += 1
            candidate = f"{base}_{n}"
        self.taken.add(candidate)
        return candidate
