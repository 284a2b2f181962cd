"""Reading run folders in tests."""

import json

# Keys of metrics.jsonl that a resumed run must reproduce exactly; the rest (energy, CO2e, money,
# times) are measurements of the machine, which no resume can make identical.
DETERMINISTIC = ("step", "epoch", "loss", "lr", "flops")


def deterministic_lines(run) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.append({k: v for k, v in rec.items() if k in DETERMINISTIC or k.startswith("val_")})
    return out
