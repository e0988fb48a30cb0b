"""The pool: nodes and devices, loaded from a pool file (YAML).

The local backend's device profiles ride along in the same file, under ``local_profile`` of each
flavor, but only ``runtime.backends.local`` reads them: nothing else may know how a chip is emulated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runtime.catalog import DeviceKind, Flavor


class PoolFileError(ValueError):
    """A pool file that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class DeviceSpec:
    device_id: str
    node: str
    flavor: str
    index: int


@dataclass(frozen=True)
class NodeSpec:
    name: str
    flavor: str
    devices: int
    rack: str = ""


@dataclass(frozen=True)
class Pool:
    flavors: dict[str, Flavor]
    nodes: tuple[NodeSpec, ...]
    local_profiles: dict[str, dict[str, Any]] = field(default_factory=dict)

    def devices(self) -> list[DeviceSpec]:
        return [
            DeviceSpec(device_id=f"{node.name}/{i}", node=node.name, flavor=node.flavor, index=i)
            for node in self.nodes
            for i in range(node.devices)
        ]


_FLAVOR_FIELDS = {
    "vendor": str,
    "kind": str,
    "model": str,
    "peak_bf16_tflops": float,
    "memory_gib": float,
    "interconnect": str,
    "interconnect_gbps": float,
    "torch_device_type": str,
    "collective_backend": str,
}


def _require(mapping: dict[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in mapping:
        raise PoolFileError(f"{where}.{key}: missing; add it ({kind.__name__})")
    value = mapping[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise PoolFileError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def parse_pool(document: dict[str, Any]) -> Pool:
    if not isinstance(document, dict):
        raise PoolFileError("pool file: expected a mapping with 'flavors' and 'nodes'")
    raw_flavors = document.get("flavors")
    if not isinstance(raw_flavors, dict) or not raw_flavors:
        raise PoolFileError("flavors: missing or empty; add a mapping of flavor name to its figures")
    flavors: dict[str, Flavor] = {}
    profiles: dict[str, dict[str, Any]] = {}
    for name, raw in raw_flavors.items():
        where = f"flavors.{name}"
        if not isinstance(raw, dict):
            raise PoolFileError(f"{where}: expected a mapping of figures")
        values = {key: _require(raw, key, where, kind) for key, kind in _FLAVOR_FIELDS.items()}
        try:
            values["kind"] = DeviceKind(values["kind"])
        except ValueError:
            choices = ", ".join(k.value for k in DeviceKind)
            raise PoolFileError(f"{where}.kind: {values['kind']!r} is not one of {choices}") from None
        try:
            flavors[name] = Flavor(name=name, **values)
        except ValueError as exc:
            raise PoolFileError(f"{where}: {exc}") from None
        profile = raw.get("local_profile", {})
        if not isinstance(profile, dict):
            raise PoolFileError(f"{where}.local_profile: expected a mapping such as {{relative_speed: 0.5}}")
        profiles[name] = dict(profile)

    raw_nodes = document.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise PoolFileError("nodes: missing or empty; add a list of {name, flavor, devices}")
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(raw, dict):
            raise PoolFileError(f"{where}: expected a mapping with name, flavor, devices")
        name = _require(raw, "name", where, str)
        flavor = _require(raw, "flavor", where, str)
        devices = _require(raw, "devices", where, int)
        if name in seen:
            raise PoolFileError(f"{where}.name: {name!r} appears twice; node names must be unique")
        if flavor not in flavors:
            raise PoolFileError(f"{where}.flavor: {flavor!r} is not defined under flavors")
        if devices < 1:
            raise PoolFileError(f"{where}.devices: must be at least 1")
        seen.add(name)
        nodes.append(NodeSpec(name=name, flavor=flavor, devices=devices, rack=str(raw.get("rack", ""))))
    return Pool(flavors=flavors, nodes=tuple(nodes), local_profiles=profiles)


def load_pool(path: str | Path) -> Pool:
    try:
        document = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise PoolFileError(f"{path}: not valid YAML ({exc})") from None
    return parse_pool(document)
