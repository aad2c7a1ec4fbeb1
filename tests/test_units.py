"""units.py is the one owner of byte units: its constants, the sizes people type, and how gpuready prints them."""

from __future__ import annotations

import pytest

from gpuready.errors import InputError
from gpuready.units import GB, GIB, KB, KIB, MB, MIB, TB, TIB, format_bytes, format_gib, format_rate, parse_size


def test_binary_and_decimal_units_are_what_their_names_say() -> None:
    assert (KIB, MIB, GIB, TIB) == (2**10, 2**20, 2**30, 2**40)
    assert (KB, MB, GB, TB) == (10**3, 10**6, 10**9, 10**12)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("24GiB", 24 * GIB), ("80GB", 80 * GB), ("81559MiB", 81559 * MIB), ("1.5TiB", int(1.5 * TIB)), ("123", 123)],
)
def test_sizes_read_in_the_unit_written(text: str, nbytes: int) -> None:
    assert parse_size(text) == nbytes


def test_a_size_without_a_known_unit_names_the_field() -> None:
    with pytest.raises(InputError, match="--disk"):
        parse_size("3 parsecs", "--disk")


def test_printed_sizes_and_rates() -> None:
    assert format_bytes(int(14.96 * GIB)) == "14.96 GiB" and format_bytes(512 * MIB) == "512.00 MiB"
    assert format_gib(512 * MIB) == "0.50 GiB" and format_gib(3 * GIB, 1) == "3.0 GiB"
    assert format_rate(1_234_567_890) == "1,235 MB/s" and format_rate(None) == "-"
