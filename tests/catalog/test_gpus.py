import pytest

from gpuready.catalog import find_gpu, load_gpus
from gpuready.errors import InputError


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("H100 SXM", "H100 SXM"),
        ("h100", "H100 SXM"),
        ("A100-40GB", "A100 SXM 40GB"),
        ("a100 pcie 80gb", "A100 PCIe 80GB"),
        ("80GB A100", "A100 SXM 80GB"),
        ("rtx4090", "RTX 4090"),
        ("4090", "RTX 4090"),
        ("l40s", "L40S"),
    ],
)
def test_names_are_forgiving(query: str, name: str) -> None:
    assert find_gpu(query).name == name


def test_unknown_gpu_names_the_flag() -> None:
    with pytest.raises(InputError, match="--gpu"):
        find_gpu("tpu-v5")


def test_every_gpu_has_a_source_and_usable_memory_below_the_label_in_gib() -> None:
    for g in load_gpus():
        assert g.source_url.startswith("https://")
        assert 0 < g.usable_bytes <= g.memory_gb * 2**30
