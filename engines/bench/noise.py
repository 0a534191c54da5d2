"""The noise band of a figure measured several times: half the spread of the runs relative to
their mean (two runs at 100 and 110 tokens/s: ±4.8 %), at least ``MIN_BAND``. The tuner decides
on it (engines/tune/verdict.py) and `traylm bench run --profiles` prints it; a difference
smaller than the wider band of the two figures compared is noise."""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_BAND = 0.02
"""Two runs that happen to agree exactly do not make a 0 % band: 2 % is the least assumed."""


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def spread(values: Sequence[float]) -> float:
    """Half the range of ``values`` relative to their mean, with no floor (0 when the mean is)."""
    m = mean(values)
    return (max(values) - min(values)) / 2 / abs(m) if m else 0.0


def band(values: Sequence[float]) -> float:
    """The noise band: ``spread`` of the values, at least MIN_BAND."""
    return max(MIN_BAND, spread(values))
