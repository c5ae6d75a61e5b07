"""Identifiers for generated code.

Generated code owns its namespace: a name made from a user's name always starts with a
prefix that the generator's own names never start with (`t_` for tensors in NumPy modules,
`in_` for kernel parameters, a template prefix for kernel names), so no user name can
shadow, or be shadowed by, a name the generator uses, whatever the user calls a tensor.
"""
import keyword
import re


def sanitize(name, default="t"):
    """A valid Python/C identifier body made from `name` (letters, digits, underscores)."""
    ident = re.sub(r"\W", "_", str(name or ""), flags=re.ASCII).strip("_") or default
    if ident[0].isdigit():
        ident = f"{default}_{ident}"
    return ident


class Namer:
    """Unique names `prefix + sanitized name`, then `..._1`, `..._2`, ..."""

    def __init__(self, prefix="", taken=()):
        self.prefix = prefix
        self.taken = set(taken)

    def __call__(self, name, default="t"):
        base = self.prefix + sanitize(name, default)
        if keyword.iskeyword(base):
            base += "_"
        candidate, n = base, 0
        while candidate in self.taken:
            n += 1
            candidate = f"{base}_{n}"
        self.taken.add(candidate)
        return candidate
