import pytest

from jobs.checks import placement_policy_is_known


def test_an_unknown_placement_policy_is_named_with_the_choices(settings):
    settings.POLYCHIP_PLACEMENT_POLICY = "Aware"
    (error,) = placement_policy_is_known(None)
    assert "POLYCHIP_PLACEMENT_POLICY='Aware'" in error.msg
    assert "aware" in error.hint and "none" in error.hint


def test_known_policies_and_none_pass(settings):
    for name in ("aware", "mixed", "fifo", "none", ""):
        settings.POLYCHIP_PLACEMENT_POLICY = name
        assert placement_policy_is_known(None) == []


def test_a_bad_link_speed_is_named_with_the_fix(settings):
    from jobs.checks import local_link_is_valid

    for value in ("fast", 0.0, -1.0, float("nan"), float("inf")):
        settings.POLYCHIP_LOCAL_LINK_GBIT = value
        (error,) = local_link_is_valid(None)
        assert error.id == "polychip.E002" and "POLYCHIP_LOCAL_LINK_GBIT=" in error.msg
        assert "Gbit/s" in error.hint and "unset" in error.hint


def test_a_bad_link_shaping_is_named_with_the_choices(settings):
    from jobs.checks import local_link_is_valid

    settings.POLYCHIP_LOCAL_LINK_GBIT = None
    settings.POLYCHIP_LOCAL_LINK_SHAPING = "tc"
    (error,) = local_link_is_valid(None)
    assert error.id == "polychip.E003" and "POLYCHIP_LOCAL_LINK_SHAPING='tc'" in error.msg
    assert all(choice in error.hint for choice in ("auto", "netns", "token_bucket"))


def test_no_throttling_and_real_speeds_pass(settings):
    from jobs.checks import local_link_is_valid

    for gbit, shaping in ((None, "auto"), (1.0, "token_bucket"), (0.25, "netns")):
        settings.POLYCHIP_LOCAL_LINK_GBIT, settings.POLYCHIP_LOCAL_LINK_SHAPING = gbit, shaping
        assert local_link_is_valid(None) == []


def test_the_local_backend_gets_the_link_settings(settings):
    from jobs.backends import get_backend

    settings.POLYCHIP_BACKEND = "local"
    settings.POLYCHIP_LOCAL_LINK_GBIT, settings.POLYCHIP_LOCAL_LINK_SHAPING = 0.5, "token_bucket"
    get_backend.cache_clear()
    try:
        backend = get_backend()
        assert (backend.link_gbit, backend.link_shaping) == (0.5, "token_bucket")  # type: ignore[attr-defined]
    finally:
        get_backend.cache_clear()


def test_a_bad_link_setting_stops_the_backend_naming_it(settings):
    from django.core.exceptions import ImproperlyConfigured

    from jobs.backends import get_backend

    settings.POLYCHIP_BACKEND = "local"
    settings.POLYCHIP_LOCAL_LINK_GBIT = "fast"
    get_backend.cache_clear()
    try:
        with pytest.raises(ImproperlyConfigured, match="POLYCHIP_LOCAL_LINK_GBIT"):
            get_backend()
    finally:
        get_backend.cache_clear()
