"""Accelerator flavors: what a kind of chip is, in public figures.

A flavor is the unit that quotas, prices and placement speak of. The figures are the vendors'
published peaks; measured throughput lives in ``runtime.throughput`` (later issues).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DeviceKind(StrEnum):
    GPU = "gpu"
    NPU = "npu"
    TPU = "tpu"
    CPU = "cpu"


@dataclass(frozen=True)
class Flavor:
    name: str
    vendor: str
    kind: DeviceKind
    model: str
    peak_bf16_tflops: float
    memory_gib: float
    interconnect: str
    interconnect_gbps: float
    torch_device_type: str
    collective_backend: str

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum():
            raise ValueError(f"flavor name {self.name!r}: use letters, digits and '-' only")
        if self.peak_bf16_tflops <= 0:
            raise ValueError(f"flavor {self.name}: peak_bf16_tflops must be > 0")
        if self.memory_gib <= 0:
            raise ValueError(f"flavor {self.name}: memory_gib must be > 0")
