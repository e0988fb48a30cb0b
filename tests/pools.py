"""Pool-file pieces that tests build their pools from."""

from __future__ import annotations

# One flavor's figures as a pool file writes them (an H100's), for pools made up in tests.
H100_FLAVOR = {
    "vendor": "nvidia",
    "kind": "gpu",
    "model": "H100",
    "peak_bf16_tflops": 989,
    "memory_gib": 80,
    "interconnect": "NVLink",
    "interconnect_gbps": 900,
    "torch_device_type": "cuda",
    "collective_backend": "nccl",
}
