"""Topology: the devices a computation runs on and the links between them (seed 001).

A device is priced by a roofline (flops over throughput, bytes over bandwidth, whichever is
larger) plus a fixed overhead per call; graph ops by the rates of the primitives they are
made of (indexed row reads, sparse-dense products, segment reductions). A link by the
alpha-beta model: latency plus bytes over bandwidth. Profiles are JSON: written by
`ngnn calibrate` for this machine, or by hand; the GPU presets are datasheet figures and
say `validated: false` until a run on such a GPU confirms them.
"""
import json
import math
import os

from ..files import write_atomically

DEVICE_FIELDS = ("flops", "memory_bandwidth", "memory_bytes", "call_overhead")
GRAPH_RATES = ("gather_bandwidth", "spmm_rate", "segment_rate", "dropout_rate")
LINK_FIELDS = ("latency", "bandwidth")


def _positive(where, name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        need = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"topology: {where}: {name} must be {need}, got {value!r}")
    return float(value)


class Device:
    """`flops` (flop/s), `memory_bandwidth` (bytes/s), `memory_bytes`, `call_overhead`
    (seconds per op call). The graph rates default to the memory bandwidth (bytes/s of
    indexed rows) and to a bandwidth-bound product (multiply-adds/s, one 4-byte row read
    each) when no calibration measured them; `dropout_rate` (elements/s of counter-based
    random masks) to one element per 4 bytes of bandwidth."""

    def __init__(self, kind, flops, memory_bandwidth, memory_bytes, call_overhead,
                 gather_bandwidth=None, spmm_rate=None, segment_rate=None,
                 dropout_rate=None, name=None):
        where = f"device {name or kind!r}"
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"topology: {where}: kind must be a non-empty string")
        self.kind, self.name = kind, name or kind
        self.flops = _positive(where, "flops", flops)
        self.memory_bandwidth = _positive(where, "memory_bandwidth", memory_bandwidth)
        self.memory_bytes = _positive(where, "memory_bytes", memory_bytes)
        self.call_overhead = _positive(where, "call_overhead", call_overhead, allow_zero=True)
        bound = self.memory_bandwidth / 4
        self.gather_bandwidth = _positive(where, "gather_bandwidth", gather_bandwidth) \
            if gather_bandwidth is not None else self.memory_bandwidth
        self.spmm_rate = _positive(where, "spmm_rate", spmm_rate) \
            if spmm_rate is not None else bound
        self.segment_rate = _positive(where, "segment_rate", segment_rate) \
            if segment_rate is not None else bound
        self.dropout_rate = _positive(where, "dropout_rate", dropout_rate) \
            if dropout_rate is not None else bound

    def to_dict(self):
        return {"name": self.name, "kind": self.kind,
                **{f: getattr(self, f) for f in DEVICE_FIELDS + GRAPH_RATES}}


class Link:
    """Between devices `ends` (a pair of device names; None: any pair without a link of
    its own): `latency` seconds per message, `bandwidth` bytes/s."""

    def __init__(self, latency, bandwidth, ends=None):
        where = f"link {ends!r}" if ends else "link"
        self.latency = _positive(where, "latency", latency, allow_zero=True)
        self.bandwidth = _positive(where, "bandwidth", bandwidth)
        if ends is not None and (not isinstance(ends, (list, tuple)) or len(ends) != 2):
            raise ValueError(f"topology: {where}: ends must be a pair of device names")
        self.ends = tuple(ends) if ends is not None else None

    def time(self, nbytes, messages=1):
        return messages * self.latency + nbytes / self.bandwidth

    def to_dict(self):
        return {"latency": self.latency, "bandwidth": self.bandwidth,
                **({"ends": list(self.ends)} if self.ends else {})}


class Topology:
    """Devices and links. `validated`: False for figures no measurement here confirmed."""

    def __init__(self, devices, links=(), name="topology", validated=True):
        if not devices:
            raise ValueError("topology: needs at least one device")
        self.devices, self.links = list(devices), list(links)
        self.name, self.validated = name, bool(validated)
        names = [d.name for d in self.devices]
        for link in self.links:
            for end in link.ends or ():
                if end not in names:
                    raise ValueError(f"topology: link end {end!r} is no device; devices: "
                                     f"{', '.join(names)}")

    def device(self, rank=0):
        """The device rank `rank` runs on (ranks beyond the list reuse the last kind)."""
        return self.devices[min(rank, len(self.devices) - 1)]

    def link(self, a=0, b=1):
        """The link between the devices of ranks a and b."""
        pair = {self.device(a).name, self.device(b).name}
        for link in self.links:
            if link.ends and set(link.ends) == pair:
                return link
        for link in self.links:
            if link.ends is None:
                return link
        raise ValueError(f"topology {self.name!r}: no link between {sorted(pair)}; add "
                         "one, or a default link without ends")

    # ---- files ---------------------------------------------------------------------------
    def to_dict(self):
        return {"name": self.name, "validated": self.validated,
                "devices": [d.to_dict() for d in self.devices],
                "links": [link.to_dict() for link in self.links]}

    @classmethod
    def from_dict(cls, data, source="topology"):
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected an object with 'devices' and 'links'")
        devices = data.get("devices")
        if not isinstance(devices, list) or not devices:
            raise ValueError(f"{source}: missing field 'devices' (a non-empty list)")
        parsed = []
        for i, entry in enumerate(devices):
            if not isinstance(entry, dict):
                raise ValueError(f"{source}: devices[{i}] must be an object")
            missing = [f for f in ("kind",) + DEVICE_FIELDS if f not in entry]
            if missing:
                raise ValueError(f"{source}: devices[{i}] is missing field(s) "
                                 f"{', '.join(missing)}")
            unknown = set(entry) - {"name", "kind"} - set(DEVICE_FIELDS) - set(GRAPH_RATES)
            if unknown:
                raise ValueError(f"{source}: devices[{i}] has unknown field(s) "
                                 f"{', '.join(sorted(unknown))}")
            parsed.append(Device(**entry))
        links = []
        for i, entry in enumerate(data.get("links", [])):
            if not isinstance(entry, dict):
                raise ValueError(f"{source}: links[{i}] must be an object")
            missing = [f for f in LINK_FIELDS if f not in entry]
            if missing:
                raise ValueError(f"{source}: links[{i}] is missing field(s) "
                                 f"{', '.join(missing)}")
            unknown = set(entry) - set(LINK_FIELDS) - {"ends"}
            if unknown:
                raise ValueError(f"{source}: links[{i}] has unknown field(s) "
                                 f"{', '.join(sorted(unknown))}")
            links.append(Link(**entry))
        return cls(parsed, links, name=str(data.get("name", "topology")),
                   validated=data.get("validated", True))

    @classmethod
    def load(cls, path):
        """A topology from a JSON file (YAML too, for .yaml/.yml, when PyYAML is installed)."""
        path = os.fspath(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path.endswith((".yaml", ".yml")):
            try:
                import yaml
            except ImportError:
                raise ImportError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); "
                                  "or write the topology as JSON") from None
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as err:
                raise ValueError(f"{path}: not valid YAML: {err}") from None
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: not valid JSON: {err}") from None
        return cls.from_dict(data, source=path)

    def save(self, path):
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        return write_atomically(path, text.encode())


def _gpu(name, flops, bandwidth, memory, link_bandwidth):
    """A preset from datasheet figures (FP32 throughput, HBM bandwidth, NVLink)."""
    device = Device("gpu", flops, bandwidth, memory, 5e-6, name=name)
    return Topology([device], [Link(2e-6, link_bandwidth)], name=f"{name} (datasheet)",
                    validated=False)


PRESETS = {
    "h100": lambda: _gpu("h100", 67e12, 3.35e12, 80 * 2 ** 30, 450e9),
    "a100": lambda: _gpu("a100", 19.5e12, 2.0e12, 80 * 2 ** 30, 300e9),
}


def preset(name):
    """A shipped topology: 'h100' or 'a100' (datasheet figures, validated: false)."""
    if name not in PRESETS:
        raise ValueError(f"no topology preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]()
