"""FAKE signatures: the bindings whose arguments differ in nvidia-ml-py 12.550.52's ``pynvml.py``.

Written by hand from that wheel (``pip download --no-deps nvidia-ml-py==12.550.52``): there,
``nvmlDeviceGetMinMaxFanSpeed`` and ``nvmlDeviceGetFanControlPolicy_v2`` take their output
arguments without defaults (defaults arrived in 12.570), and ``nvmlDeviceGetTemperatureV`` and
``nvmlDeviceGetMarginTemperature`` do not exist. Only the signatures matter: ``create_autospec``
copies them, so a call the way the 12.570+ binding is called raises ``TypeError`` like the real
12.550 module would. The bodies are never run.
"""

from __future__ import annotations

from typing import Any


def nvmlDeviceGetMinMaxFanSpeed(handle: Any, minSpeed: Any, maxSpeed: Any) -> Any:
    raise NotImplementedError


def nvmlDeviceGetFanControlPolicy_v2(handle: Any, fan: Any, fanControlPolicy: Any) -> Any:
    raise NotImplementedError


CHANGED = {
    "nvmlDeviceGetMinMaxFanSpeed": nvmlDeviceGetMinMaxFanSpeed,
    "nvmlDeviceGetFanControlPolicy_v2": nvmlDeviceGetFanControlPolicy_v2,
}
ABSENT = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetMarginTemperature")
