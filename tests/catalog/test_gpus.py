import pytest

from gpuready.catalog import card_for_device, find_architecture, find_gpu, load_architectures, load_gpus
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


def test_gpu_names_as_nvml_prints_them_find_their_compute_capability() -> None:
    def cc(name: str) -> tuple[int, int] | None:
        row = find_architecture(name)
        return row.capability if row else None

    assert cc("NVIDIA H100 80GB HBM3") == (9, 0)
    assert cc("NVIDIA GeForce RTX 5090") == (12, 0)
    assert cc("NVIDIA A10G") == (8, 6)  # the longer match: A10G, not A10
    assert cc("NVIDIA A40") == (8, 6)  # no spec row in the catalog, still known by name
    assert find_architecture("NVIDIA L40S").name == "L40S"  # type: ignore[union-attr]
    assert find_architecture("Matrox G200") is None


def test_every_card_takes_compute_capability_and_architecture_from_the_one_table() -> None:
    """The catalog's cards have no compute-capability column of their own: each NVIDIA card finds a row of
    data/architectures.csv, so a fact about a GPU is written once (issue 14, one owner per fact)."""
    rows = {row.name: row for row in load_architectures()}
    assert all(row.source.strip() for row in rows.values())
    for g in load_gpus():
        row = find_architecture(g.name)
        assert row is not None, g.name
        assert (g.compute_capability, g.architecture) == (row.compute_capability, row.architecture)
        if g.vendor == "NVIDIA":
            assert row.capability is not None, g.name
    assert find_gpu("T4").compute_capability == "7.5" and find_gpu("H200").architecture == "Hopper"
    mi300x = find_gpu("MI300X")
    assert mi300x.compute_capability is None and mi300x.architecture and "gfx942" in mi300x.architecture


@pytest.mark.parametrize(
    ("device", "name"),
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L4", "L4"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2 32GB"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("NVIDIA B200", "B200 (HGX/DGX per GPU)"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_driver_device_names_find_their_catalog_card(device: str, name: str) -> None:
    """One matcher for the names NVML/ROCm report, used by bench's prices and plan's calibration alike."""
    card = card_for_device(device)
    assert card is not None and card.name == name


def test_the_device_memory_decides_between_sizes_of_one_model() -> None:
    forty = find_gpu("A100 SXM 40GB").usable_bytes
    assert card_for_device("NVIDIA A100-SXM4", forty).name == "A100 SXM 40GB"  # type: ignore[union-attr]
    assert card_for_device("NVIDIA A100-SXM4").name == "A100 SXM 80GB"  # type: ignore[union-attr]
    assert card_for_device("Intel Arc A770") is None and card_for_device("") is None
