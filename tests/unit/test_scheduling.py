import pytest

from runtime.scheduling import FreeDevice, GangRequest, Placement, Refusal, place_gang


def devices(flavor: str, node: str, count: int) -> list[FreeDevice]:
    return [FreeDevice(device_id=f"{node}/{i}", node=node, flavor=flavor) for i in range(count)]


POOL = devices("h100", "h-0", 2) + devices("a100", "a-0", 3) + devices("a100", "a-1", 4) + devices("tpu", "t-0", 4)


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        # One flavor in the spec's order of preference, packed onto the fullest node first.
        (GangRequest(2, ("h100", "a100")), ["h-0/0", "h-0/1"]),
        (GangRequest(3, ("a100",)), ["a-1/0", "a-1/1", "a-1/2"]),
        (GangRequest(5, ("a100",)), ["a-1/0", "a-1/1", "a-1/2", "a-1/3", "a-0/0"]),
        # No single flavor suffices: mix, still in the spec's order.
        (GangRequest(5, ("h100", "tpu")), ["h-0/0", "h-0/1", "t-0/0", "t-0/1", "t-0/2"]),
        (GangRequest(3, ("h100", "a100")), ["a-1/0", "a-1/1", "a-1/2"]),
    ],
)
def test_gang_placement(request_, expected):
    decision = place_gang(request_, POOL)
    assert isinstance(decision, Placement)
    assert [d.device_id for d in decision.devices] == expected


def test_a_gang_is_all_or_nothing_with_a_reason():
    decision = place_gang(GangRequest(7, ("h100", "tpu")), POOL)
    assert decision == Refusal(reason="waiting for 7 devices; free now: 2 h100, 4 tpu")


def test_flavors_not_allowed_are_never_used():
    decision = place_gang(GangRequest(4, ("tpu",)), POOL)
    assert isinstance(decision, Placement) and decision.flavors == ("tpu",)
