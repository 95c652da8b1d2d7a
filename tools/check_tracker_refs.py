#!/usr/bin/env python3
"""Code and docs explain themselves: no tracker references ("issue 33") outside CHANGELOG.md.

A reader of the code or the docs cannot open the tracker; what an issue asked for belongs in the
text itself (the algorithm, the measurement, the reason). Exits non-zero listing each hit.
Standard library and git only; run from anywhere inside the repository.
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATTERN = r"[Ii]ssue #?[0-9]+"


def main():
    found = subprocess.run(
        ["git", "grep", "-nE", PATTERN, "--", ".", ":!CHANGELOG.md", ":!tools/check_tracker_refs.py"],
        cwd=ROOT, capture_output=True, text=True, check=False)
    if found.returncode not in (0, 1):
        sys.exit(f"check_tracker_refs: git grep failed: {found.stderr.strip()}")
    hits = found.stdout.strip().splitlines()
    for hit in hits:
        print(f"check_tracker_refs: {hit}")
    if hits:
        sys.exit(f"check_tracker_refs: {len(hits)} tracker reference(s); say what is meant instead")
    print("check_tracker_refs: no tracker references outside CHANGELOG.md")


if __name__ == "__main__":
    main()
