from gpuready.doctor.tables import (
    covers,
    cuda_driver_table,
    cuda_for_driver,
    docker_image_table,
    mvc_min_driver,
    parse_capability,
    wheel_table,
    wheels_for,
)


def test_every_table_loads_and_every_row_has_a_source() -> None:
    for table in (cuda_driver_table(), wheel_table(), docker_image_table()):
        assert len(table) >= 5
        assert all(row.source.strip() for row in table)


def test_driver_floors_follow_nvidia_minor_version_compatibility() -> None:
    assert mvc_min_driver(11) == "450.80.02"
    assert mvc_min_driver(12) == "525.60.13"
    assert mvc_min_driver(13) == "580.65.06"
    assert cuda_for_driver("535.104.05") == "12.2"
    assert cuda_for_driver("580.159.04") == "13.0"


def test_architectures_cubin_same_major_and_ptx() -> None:
    (cu130,) = [r for r in wheels_for("2.11") if r.variant == "cu130"]
    assert covers(cu130, (9, 0)) is True
    assert covers(cu130, (8, 9)) is True  # the sm_86 cubin serves Ada
    assert covers(cu130, (7, 0)) is False  # Volta dropped
    (cu124,) = [r for r in wheels_for("2.5") if r.variant == "cu124"]
    assert covers(cu124, (12, 0)) is False  # RTX 5090 needs cu128+
    (cu128,) = [r for r in wheels_for("2.7") if r.variant == "cu128"]
    assert covers(cu128, (12, 1)) is True  # PTX 12.0
    assert parse_capability("sm_100") == (10, 0)
