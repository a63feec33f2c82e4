"""TFRecord's masked CRC-32C, for TensorBoard event files.

Each event is framed with the CRC-32C (Castagnoli) of its length and of its bytes. The
C code of google-crc32c (a treadle dependency) computes one in well under a
microsecond, but loading it costs about 0.6 ms, as much as checksumming some 5 KB in
Python (a table lookup per byte, about 0.1 us). So :class:`MaskedCrc32c` checksums in
Python until ``load_after`` bytes have gone through it, then loads the C code: a short
run's few events (a sweep, a test, a notebook) never pay the load, a long run pays it
once. Without google-crc32c, Python throughout.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["MaskedCrc32c", "crc32c"]

_POLY = 0x82F63B78  # Castagnoli, bit-reflected
_table: list[int] = []


def _build_table() -> list[int]:
    # The table is linear over XOR (T[a ^ b] = T[a] ^ T[b]): the eight single-bit
    # entries by the bitwise definition, every other one from two smaller ones.
    table = [0] * 256
    for bit in range(8):
        crc = 1 << bit
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table[1 << bit] = crc
    for i in range(3, 256):
        low = i & -i
        if low != i:
            table[i] = table[low] ^ table[i ^ low]
    return table


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data`` in Python (the C code's value, slower: for short inputs)."""
    if not _table:
        _table.extend(_build_table())
    table, crc = _table, 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _c_code() -> Callable[[bytes], int] | None:
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value if getattr(google_crc32c, "implementation", "c") == "c" else None


class MaskedCrc32c:
    """``masked(data) -> int``: TFRecord's masked CRC-32C, in Python for the first
    ``load_after`` bytes, then in google-crc32c's C code (see the module docstring)."""

    def __init__(self, load_after: int = 4096) -> None:
        self._left = load_after
        self._fast: Callable[[bytes], int] | None = None

    @property
    def uses_c(self) -> bool:
        """Whether the C code computes the checksums now."""
        return self._fast is not None and self._fast is not crc32c

    def __call__(self, data: bytes) -> int:
        if self._fast is None:
            self._left -= len(data)
            if self._left >= 0:
                return _mask(crc32c(data))
            self._fast = _c_code() or crc32c
        return _mask(self._fast(data))
