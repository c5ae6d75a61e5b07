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
GRAPH_RATES = ("gather_bandwidth", "spmm_rate", "segment_rate", "dropout_rate",
               "transcendental_rate", "repeat_rate", "transpose_rate")
OPTIONAL_DEVICE_FIELDS = GRAPH_RATES + ("cores", "cache_bytes", "curves")
LINK_FIELDS = ("latency", "bandwidth")
OPTIONAL_LINK_FIELDS = ("ends", "allreduce_latency", "allreduce_bandwidth", "contention",
                        "poll_slack")


def _positive(where, name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        need = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"topology: {where}: {name} must be {need}, got {value!r}")
    return float(value)


class Curve:
    """Seconds per item of a primitive, measured at `widths` (elements per row) for tables
    of `rows` rows: `seconds[i][j]` at rows[i], widths[j]. Read between the measured points
    by interpolating in log rows and log width; outside, the nearest table size, the
    narrowest width, and past the widest width a cost growing with the width."""

    def __init__(self, rows, widths, seconds, where="curve"):
        self.rows = [_positive(where, "rows", r) for r in rows]
        self.widths = [_positive(where, "widths", w) for w in widths]
        if not self.rows or not self.widths or self.rows != sorted(set(self.rows)) or \
                self.widths != sorted(set(self.widths)):
            raise ValueError(f"topology: {where}: rows and widths must be increasing, "
                             "non-empty lists")
        if not isinstance(seconds, list) or len(seconds) != len(self.rows) or any(
                not isinstance(r, list) or len(r) != len(self.widths) for r in seconds):
            raise ValueError(f"topology: {where}: seconds must be {len(self.rows)} rows of "
                             f"{len(self.widths)} figures")
        self.seconds = [[_positive(where, "seconds", v) for v in r] for r in seconds]

    def __call__(self, width, rows=None):
        width = max(float(width), 1.0)
        by_rows = [self._along_width(r, width) for r in self.seconds]
        if rows is None or len(self.rows) == 1:
            return by_rows[0]
        return math.exp(_interpolate(self.rows, [math.log(v) for v in by_rows],
                                     max(float(rows), 1.0)))

    def _along_width(self, row, width):
        if width >= self.widths[-1]:
            return row[-1] * width / self.widths[-1]
        return math.exp(_interpolate(self.widths, [math.log(v) for v in row], width))

    def to_dict(self):
        return {"rows": self.rows, "widths": self.widths, "seconds": self.seconds}


class SharedCurve:
    """A curve read as by a process that shares its last-level cache with `ways - 1`
    others: a table of R rows costs what R * ways rows cost alone, as its share of the
    cache is 1 / ways."""

    def __init__(self, curve, ways):
        self.curve, self.ways = curve, ways

    def __call__(self, width, rows=None):
        return self.curve(width, None if rows is None else rows * self.ways)

    @property
    def rows(self):
        """The table sizes at which it reads the measured points."""
        return [rows / self.ways for rows in self.curve.rows]


# Curves of random reads from a table of `rows` rows, which the last-level cache serves
# (with their "out_" and "_busy" variants). Streaming reads and element-wise
# functions (their cached point fits a core's own L2), products (by their inner size)
# and dropout bits do not depend on a share of it.
SHARED_CURVES = ("take", "edge_take", "keep_take", "spmm", "gather_sum_heads", "pick", "place")


def reads_shared_cache(name):
    base = name[len("out_"):] if name.startswith("out_") else name
    return base.removesuffix("_busy").removesuffix("_short") in SHARED_CURVES


def _interpolate(points, values, at):
    """Linear in log(at) between the measured points, the end value outside them."""
    if at <= points[0] or len(points) == 1:
        return values[0]
    if at >= points[-1]:
        return values[-1]
    i = next(i for i in range(1, len(points)) if at <= points[i])
    t = (math.log(at) - math.log(points[i - 1])) / (math.log(points[i]) -
                                                    math.log(points[i - 1]))
    return values[i - 1] + t * (values[i] - values[i - 1])


class Device:
    """`flops` (flop/s), `memory_bandwidth` (bytes/s), `memory_bytes`, `call_overhead`
    (seconds per op call). The graph rates default to the memory bandwidth (bytes/s of
    indexed rows) and to a bandwidth-bound product (multiply-adds/s, one 4-byte row read
    each) when no calibration measured them; `dropout_rate`, `transcendental_rate` and
    `repeat_rate` (elements/s of random masks, of exp, of segment ids) to one element per
    4 bytes of bandwidth, `transpose_rate` (bytes/s of a strided copy) to a quarter of
    it. `curves` ({primitive: Curve}, from calibration) replace the scalar rates of the
    primitives they measure. `cores`: how many ranks can run on this
    device at once (a CPU host's cores; None for a device per rank). `cache_bytes`: a
    core's share of the last-level cache, which decides whether a table read back is
    still in it (the "_warm" curves; None: never)."""

    def __init__(self, kind, flops, memory_bandwidth, memory_bytes, call_overhead,
                 gather_bandwidth=None, spmm_rate=None, segment_rate=None,
                 dropout_rate=None, transcendental_rate=None, repeat_rate=None,
                 transpose_rate=None, cores=None, cache_bytes=None, curves=None, name=None):
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
        self.transcendental_rate = _positive(where, "transcendental_rate",
                                             transcendental_rate) \
            if transcendental_rate is not None else bound
        self.repeat_rate = _positive(where, "repeat_rate", repeat_rate) \
            if repeat_rate is not None else bound
        self.transpose_rate = _positive(where, "transpose_rate", transpose_rate) \
            if transpose_rate is not None else self.memory_bandwidth / 4
        if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int)
                                  or cores < 1):
            raise ValueError(f"topology: {where}: cores must be a positive integer, got "
                             f"{cores!r}")
        self.cores = cores
        self.cache_bytes = _positive(where, "cache_bytes", cache_bytes) \
            if cache_bytes is not None else None
        curves = curves or {}
        if not isinstance(curves, dict):
            raise ValueError(f"topology: {where}: curves must be an object")
        self.curves = {name: c if isinstance(c, Curve) else _curve(c, f"{where}: curve "
                                                                      f"{name!r}")
                       for name, c in curves.items()}

    def sharing(self, ways):
        """This device as one of `ways` processes running on it at once see it: each
        reads its tables at random with a `ways`-th of the cache (`SharedCurve`)."""
        import copy
        shared = copy.copy(self)
        shared.curves = {name: SharedCurve(c, ways) if ways > 1 and reads_shared_cache(name)
                         else c for name, c in self.curves.items()}
        return shared

    def to_dict(self):
        extra = {field: getattr(self, field) for field in ("cores", "cache_bytes")
                 if getattr(self, field) is not None}
        if self.curves:
            extra["curves"] = {name: c.to_dict() for name, c in self.curves.items()}
        return {"name": self.name, "kind": self.kind,
                **{f: getattr(self, f) for f in DEVICE_FIELDS + GRAPH_RATES}, **extra}


def _curve(data, where):
    if not isinstance(data, dict) or set(data) != {"rows", "widths", "seconds"}:
        raise ValueError(f"topology: {where}: expected an object with rows, widths and "
                         "seconds")
    return Curve(data["rows"], data["widths"], data["seconds"], where)


class Link:
    """Between devices `ends` (a pair of device names; None: any pair without a link of
    its own): `latency` seconds per message, `bandwidth` bytes/s; `allreduce_latency`
    and `allreduce_bandwidth` those of an all-reduce (default two latencies and the
    link's bandwidth); `contention`, how much
    slower each rank computes while its peers compute beside it on the same host
    (calibrated: both ranks on this machine share its memory and cores; 1 for separate
    devices); `poll_slack`, how much longer than asked a waiting rank sleeps between
    polls (the OS timer's slack; calibrated, default 0)."""

    def __init__(self, latency, bandwidth, ends=None, allreduce_latency=None,
                 allreduce_bandwidth=None, contention=1.0, poll_slack=0.0):
        where = f"link {ends!r}" if ends else "link"
        self.latency = _positive(where, "latency", latency, allow_zero=True)
        self.bandwidth = _positive(where, "bandwidth", bandwidth)
        self.allreduce_latency = 2 * self.latency if allreduce_latency is None else \
            _positive(where, "allreduce_latency", allreduce_latency, allow_zero=True)
        self.allreduce_bandwidth = self.bandwidth if allreduce_bandwidth is None else \
            _positive(where, "allreduce_bandwidth", allreduce_bandwidth)
        self.contention = _positive(where, "contention", contention)
        self.poll_slack = _positive(where, "poll_slack", poll_slack, allow_zero=True)
        if ends is not None and (not isinstance(ends, (list, tuple)) or len(ends) != 2):
            raise ValueError(f"topology: {where}: ends must be a pair of device names")
        self.ends = tuple(ends) if ends is not None else None

    def time(self, nbytes, messages=1):
        return messages * self.latency + nbytes / self.bandwidth

    def to_dict(self):
        return {"latency": self.latency, "bandwidth": self.bandwidth,
                "allreduce_latency": self.allreduce_latency,
                "allreduce_bandwidth": self.allreduce_bandwidth, "contention": self.contention,
                "poll_slack": self.poll_slack, **({"ends": list(self.ends)} if self.ends else {})}


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

    def shared_by(self, ranks):
        """This topology as `ranks` ranks use it: where they share a host (a device with
        `cores`), as many as run at once share its cache (`Device.sharing`)."""
        import copy
        shared = copy.copy(self)
        on_each = -(-ranks // len(self.devices))
        shared.devices = [d.sharing(min(on_each, d.cores)) if d.cores else d
                          for d in self.devices]
        return shared

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
            unknown = set(entry) - {"name", "kind"} - set(DEVICE_FIELDS) - \
                set(OPTIONAL_DEVICE_FIELDS)
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
            unknown = set(entry) - set(LINK_FIELDS) - set(OPTIONAL_LINK_FIELDS)
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
