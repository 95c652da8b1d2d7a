"""Envoy's /stats histogram lines (histogram_buckets=none) as a table of P25/P50/P90 µs."""
import re, sys

print(f"{'histogram':50} {'P25':>7} {'P50':>7} {'P90':>7}")
for line in sys.stdin:
    name, _, rest = line.partition(": ")
    # P25(interval,cumulative): the cumulative figure, over the whole run (the last flush interval
    # may have seen nothing).
    q = dict(re.findall(r"P([0-9.]+)\([0-9.na]+,([0-9.na]+)\)", rest))
    if "50" in q:
        print(f"{name.removeprefix('wasmcustom.'):50} {float(q['25']):7.1f} {float(q['50']):7.1f} {float(q['90']):7.1f}")
