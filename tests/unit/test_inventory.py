from pathlib import Path

import pytest

from runtime.catalog import DeviceKind
from runtime.inventory import PoolFileError, load_pool, parse_pool

DEMO = Path(__file__).resolve().parents[2] / "runtime" / "pools" / "demo.yaml"


def test_the_demo_pool_has_two_gpu_generations_an_npu_and_a_tpu():
    pool = load_pool(DEMO)
    kinds = sorted(f.kind for f in pool.flavors.values())
    assert kinds.count(DeviceKind.GPU) >= 2 and DeviceKind.NPU in kinds and DeviceKind.TPU in kinds
    assert all(f.peak_bf16_tflops > 0 and f.memory_gib > 0 and f.interconnect for f in pool.flavors.values())
    assert all(0 < p["relative_speed"] <= 1 for p in pool.local_profiles.values())
    assert len(pool.devices()) == sum(n.devices for n in pool.nodes)
    assert len({d.device_id for d in pool.devices()}) == len(pool.devices())


def _doc(**changes):
    flavor = {
        "vendor": "v",
        "kind": "gpu",
        "model": "m",
        "peak_bf16_tflops": 1,
        "memory_gib": 1,
        "interconnect": "x",
        "interconnect_gbps": 1,
        "torch_device_type": "cuda",
        "collective_backend": "nccl",
    }
    doc = {"flavors": {"f": flavor}, "nodes": [{"name": "n", "flavor": "f", "devices": 1}]}
    for path, value in changes.items():
        target = doc
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return doc


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"flavors__f__kind": "fpga"}, "flavors.f.kind: 'fpga' is not one of"),
        ({"flavors__f__memory_gib": "lots"}, "flavors.f.memory_gib: expected float"),
        ({"flavors__f__peak_bf16_tflops": 0}, "peak_bf16_tflops must be > 0"),
        ({"nodes__0__flavor": "g"}, "nodes[0].flavor: 'g' is not defined"),
        ({"nodes__0__devices": 0}, "nodes[0].devices: must be at least 1"),
        ({"nodes": []}, "nodes: missing or empty"),
    ],
)
def test_a_bad_pool_file_names_the_field(changes, message):
    with pytest.raises(PoolFileError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_pool(_doc(**changes))
