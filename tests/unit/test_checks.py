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
