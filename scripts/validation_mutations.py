"""The mutation test of the validation table, printed: each pipeline mutation (vitpos.validation.mutations)
and the rows it flips. `python scripts/validation_mutations.py [--images N]`; docs/methods.md holds its output."""

from __future__ import annotations

import argparse
import time

from vitpos.validation.mutations import MutationResult, run_mutations
from vitpos.validation.table import registered_cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=300, help="planted images per APE case (the table's default: 300)")
    args = ap.parse_args()
    t0 = time.time()

    def show(r: MutationResult) -> None:
        flipped = "; ".join(f"{f.claim} {f.case} ({'true' if f.planted else 'false'}): {f.before} -> {f.after}"
                            for f in r.flips) or "NOTHING"
        print(f"| {r.mutation.name} | {r.mutation.what} | {len(r.flips)} | {flipped} |", flush=True)

    print("| mutation | what it breaks | rows flipped | which |\n|---|---|---|---|")
    base, results = run_mutations(registered_cases(), args.images, (0, 1), on_done=show)
    missed = [r.mutation.name for r in results if not r.flips]
    print(f"\nbaseline: {sum(r.passes for r in base.rows)} of {len(base.rows)} rows as planted; "
          f"{len(results) - len(missed)} of {len(results)} mutations flip a row; flipping nothing: {missed or 'none'}; "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
