"""Print the validation table with the conditions that decided each row, and per claim how many
planted-false rows each condition decides alone (0: switched off, no row would notice).

    .venv/bin/python scripts/validation_power.py [--images 300] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitpos.validation.table import validation_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=300, help="planted images per APE case (the run's default)")
    ap.add_argument("--json", type=Path, default=None, help="also write the table and the power counts here")
    args = ap.parse_args()
    table = validation_table(n_images=args.images)
    print(table.markdown())
    power = table.power()
    print("\nplanted-false rows each condition decides alone:")
    for claim, counts in power.items():
        print(f"  {claim}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if args.json is not None:
        args.json.write_text(json.dumps({"table": table.model_dump(mode="json"), "power": power}, indent=1))


if __name__ == "__main__":
    main()
