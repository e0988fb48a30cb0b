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


def test_an_unknown_backend_is_named_with_the_choices(settings):
    from jobs.checks import backend_is_configured

    settings.POLYCHIP_BACKEND = "k8s"
    (error,) = backend_is_configured(None)
    assert error.id == "polychip.E004" and "POLYCHIP_BACKEND='k8s'" in error.msg
    assert "local" in error.hint and "kubernetes" in error.hint
    settings.POLYCHIP_BACKEND = "local"
    assert backend_is_configured(None) == []  # the Kubernetes settings are not read for the local backend


KUBERNETES_POOL = """
kubernetes: {rack_label: topology.kubernetes.io/zone}
flavors:
  h100-sxm:
    {vendor: nvidia, kind: gpu, model: H100, peak_bf16_tflops: 989, memory_gib: 80, interconnect: NVLink,
     interconnect_gbps: 900, torch_device_type: cuda, collective_backend: nccl, kubernetes: {RESOURCE}}
"""


def kubernetes_settings(settings, tmp_path, resource="{resource: nvidia.com/gpu}"):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    pool = tmp_path / "pool.yaml"
    pool.write_text(KUBERNETES_POOL.replace("{RESOURCE}", resource))
    settings.POLYCHIP_BACKEND = "kubernetes"
    settings.POLYCHIP_K8S_KUBECONFIG = str(kubeconfig)
    settings.POLYCHIP_K8S_WORKER_IMAGE = "registry.example.com/polychip:0.1.0"
    settings.POLYCHIP_K8S_NAMESPACE_PREFIX = "polychip-t-"
    settings.POLYCHIP_POOL_FILE = str(pool)
    settings.POLYCHIP_CHECKPOINT_URL = "s3://checkpoints/polychip"


def test_a_complete_kubernetes_configuration_passes(settings, tmp_path):
    from jobs.checks import backend_is_configured

    kubernetes_settings(settings, tmp_path)
    assert backend_is_configured(None) == []


def test_a_checkpoint_folder_on_the_control_plane_is_a_warning_on_a_cluster(settings, tmp_path):
    from jobs.checks import backend_is_configured

    kubernetes_settings(settings, tmp_path)
    settings.POLYCHIP_CHECKPOINT_URL = "file:///var/lib/polychip/checkpoints"
    (warning,) = backend_is_configured(None)
    assert warning.id == "polychip.W001" and not warning.is_serious()
    assert "every node mounts it" in warning.msg and "s3://" in warning.hint


@pytest.mark.parametrize(
    ("name", "value", "error_id", "named"),
    [
        ("POLYCHIP_K8S_KUBECONFIG", "/nowhere/kubeconfig", "polychip.E005", "is not a file"),
        ("POLYCHIP_K8S_KUBECONFIG", "", "polychip.E005", "not in a cluster"),
        ("POLYCHIP_K8S_WORKER_IMAGE", "", "polychip.E006", "is not an image reference"),
        ("POLYCHIP_K8S_WORKER_IMAGE", "polychip :1", "polychip.E006", "is not an image reference"),
        ("POLYCHIP_K8S_NAMESPACE_PREFIX", "Polychip_", "polychip.E007", "cannot begin a namespace name"),
        ("POLYCHIP_K8S_NAMESPACE_PREFIX", "p" * 40, "polychip.E007", "cannot begin a namespace name"),
    ],
)
def test_a_bad_kubernetes_setting_is_named_with_the_fix(settings, tmp_path, monkeypatch, name, value, error_id, named):
    from jobs.checks import backend_is_configured

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubernetes_settings(settings, tmp_path)
    setattr(settings, name, value)
    (error,) = backend_is_configured(None)
    assert error.id == error_id and name in error.msg
    assert named in error.msg and error.hint


def test_in_a_cluster_an_empty_kubeconfig_means_the_service_account(settings, tmp_path, monkeypatch):
    from jobs.checks import backend_is_configured

    kubernetes_settings(settings, tmp_path)
    settings.POLYCHIP_K8S_KUBECONFIG = ""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert backend_is_configured(None) == []


def test_a_bad_kubernetes_section_of_the_pool_file_is_named(settings, tmp_path):
    from jobs.checks import backend_is_configured

    kubernetes_settings(settings, tmp_path, resource="{resource: gpu}")
    (error,) = backend_is_configured(None)
    assert error.id == "polychip.E008"
    assert "flavors.h100-sxm.kubernetes.resource: 'gpu' is not an extended resource name" in error.msg
