#!/usr/bin/env python3
"""Self time by function in a V8 .cpuprofile (node --cpu-prof), top N, as a share of all samples."""
import json
import sys
from collections import Counter


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    prof = json.load(open(path))
    nodes = {n["id"]: n for n in prof["nodes"]}
    hits = Counter()
    for sample in prof["samples"]:
        frame = nodes[sample]["callFrame"]
        hits[frame["functionName"] or "(anonymous)"] += 1
    total = sum(hits.values())
    for name, n in hits.most_common(top):
        print(f"{100 * n / total:5.1f}%  {name[:140]}")


if __name__ == "__main__":
    main()
