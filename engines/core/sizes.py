"""Sizes said to a person: bytes in binary units, as the CLI prints them."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``n`` bytes as B, KiB, MiB, GiB or TiB (two decimals above bytes)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
