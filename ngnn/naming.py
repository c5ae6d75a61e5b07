"""Identifiers for generated code.

Generated code owns its namespace: a name made from a user's name always starts with a
prefix that the generator's own names never start with (`t_` for tensors in NumPy modules
and for GPU kernel parameters, a group or template prefix for kernel names), so no user
name can shadow, or be shadowed by, a name the generator uses, whatever the user calls a
tensor.

A value has one name from the IR to the generated code: the IR's `%id` (`%8`, or the
user's name, `%alpha`, made unique by the IR) is `<role>_id` in Python (`value_identifier`):
`t_8` the tensor, `b_8` its rows in a fused group's block, `w_8` the workspace array
those rows live in (`VALUE_ROLES`). The IR's ids are unique and a role is the text before
the first `_`, so the map is one-to-one; and no name of the generator's own (`g0`, `v0`,
`seg`, `n_e`, `workspace`, ...) starts with a role and `_`, so none collides with a value's.
GPU kernels use the same `t_8` for the parameter holding `%8` (their own names are `gid`,
`v1`, `acc2`, `graph_in_indptr`, `partials`, ...).
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


# What a per-value identifier in generated NumPy code stands for (value_identifier).
VALUE_ROLES = {
    "t": "the tensor",
    "b": "its rows in a fused group's block",
    "w": "the workspace array its block rows live in",
    "k": "a dropout's keep bits",
    "h": "a node tensor copied head by head for a sparse product",
    "wh": "the workspace array of that copy",
    "c": "a node tensor widened to float64 for a sparse product that sums in float64",
    "hc": "a node tensor copied head by head and widened, for such a product",
    "whc": "the workspace array of that copy",
}


def value_identifier(ir_name, role="t"):
    """The Python identifier of the IR's value `ir_name` (`%8` -> `t_8`, `%alpha` ->
    `t_alpha`) in one of its `VALUE_ROLES`."""
    assert role in VALUE_ROLES, role
    return f"{role}_{ir_name[1:]}"
