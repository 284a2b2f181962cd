"""Device-hours and their price.

A GPU run counts wall-hours per GPU. A CPU run counts vCPU-hours: wall-hours x the threads torch
uses, the unit clouds bill CPUs in. Prices are per device-hour, matched by a case-insensitive
substring of the device's name (the longest key wins); `ledger.prices` adds to or overrides the table.

DEFAULT_PRICES are rough on-demand list prices of the big clouds, in USD, 2024-2025. They exist so a
ledger shows an order of magnitude out of the box; put your own contract's prices in `ledger.prices`.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch

DEFAULT_PRICES: dict[str, float] = {  # USD per device-hour
    "cpu": 0.04,  # per vCPU-hour (general-purpose VMs: ~$0.03-0.05)
    "T4": 0.35,
    "L4": 0.80,
    "A10": 1.00,
    "L40S": 1.90,
    "V100": 2.50,
    "A100": 2.50,
    "H100": 4.00,
    "H200": 5.00,
}


def device_units(device: torch.device) -> tuple[str, int]:
    """(device type name, how many of them the run holds)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device), 1
    if device.type == "cpu":
        return "cpu", torch.get_num_threads()
    return device.type, 1


def price_for(name: str, overrides: Mapping[str, float] = ()) -> tuple[Optional[float], str]:
    """(price per device-hour, source); None when no key matches."""
    for table, source in ((dict(overrides), "ledger.prices"), (DEFAULT_PRICES, "ecotrain default table")):
        hits = [k for k in table if k.lower() in name.lower()]
        if hits:
            return float(table[max(hits, key=len)]), source
    return None, "no price"
