#!/usr/bin/env python3
"""Size limits of the plugin's production code, with an allowlist that may only shrink.

* A production file of `src/` (its lines before a trailing `#[cfg(test)] mod …`; test files
  and test modules do not count) has at most FILE_LIMIT lines.
* A production function has at most 80 lines: clippy's `too_many_lines` (threshold in
  clippy.toml, denied in Cargo.toml) checks that; this script checks that every
  `#[allow(clippy::too_many_lines)]` outside tests is one the allowlist names.

`tools/size_allowlist.txt` lists what is over today, each file with the lines it may not grow
past: an entry that is no longer needed fails the check too (delete it: the list only
shrinks). Run by `make lint`.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_layers import outside_tests  # noqa: E402

FILE_LIMIT = 600
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
ALLOWLIST = os.path.join(ROOT, "tools", "size_allowlist.txt")
TEST_ALLOW = "// tests:"
FN = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?fn\s+([A-Za-z0-9_]+)")


def production_lines(lines):
    return [line for line in outside_tests(lines) if line is not None]


def test_files():
    """Files declared as test modules (`#[cfg(test)]` … `mod name;`)."""
    out = set()
    for root, _, names in os.walk(SRC):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(root, name)
            lines = open(path, encoding="utf-8").read().split("\n")
            base = root if name in ("mod.rs", "lib.rs") else os.path.join(root, name[:-3])
            for i, line in enumerate(lines):
                m = re.match(r"\s*(?:pub(?:\([a-z]+\))?\s+)?mod ([a-z_]+);", line)
                if m and any("cfg(test)" in l for l in lines[max(0, i - 2) : i]):
                    out.add(os.path.normpath(os.path.join(base, m.group(1) + ".rs")))
    return out


def main():
    allowed_files, allowed_fns = {}, set()
    for raw in open(ALLOWLIST, encoding="utf-8"):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, rest = line.split(None, 1)
        if kind == "file":
            path, limit = rest.split()
            allowed_files[path] = int(limit)
        elif kind == "fn":
            allowed_fns.add(rest.strip())
    tests = test_files()
    problems, seen_files, seen_fns = [], set(), set()
    for root, _, names in os.walk(SRC):
        for name in sorted(names):
            path = os.path.normpath(os.path.join(root, name))
            if not name.endswith(".rs") or path in tests or name == "testing.rs":
                continue
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            lines = open(path, encoding="utf-8").read().split("\n")
            prod = production_lines(lines)
            n = len(prod)
            if n > FILE_LIMIT:
                seen_files.add(rel)
                limit = allowed_files.get(rel)
                if limit is None:
                    problems.append(f"{rel}: {n} production lines (limit {FILE_LIMIT}): split it")
                elif n > limit:
                    problems.append(f"{rel}: {n} production lines, past its allowlisted {limit}")
            for i, line in enumerate(prod):
                if "allow(clippy::too_many_lines)" not in line or TEST_ALLOW in line:
                    continue
                fn = next((FN.match(l).group(1) for l in prod[i + 1 : i + 6] if FN.match(l)), "?")
                key = f"{rel}:{fn}"
                seen_fns.add(key)
                if key not in allowed_fns:
                    problems.append(f"{key}: over 80 lines with clippy's lint allowed: split it")
    for rel in sorted(set(allowed_files) - seen_files):
        problems.append(f"{rel}: within {FILE_LIMIT} lines now: remove it from {ALLOWLIST}")
    for key in sorted(allowed_fns - seen_fns):
        problems.append(f"{key}: no longer allowed long: remove it from {ALLOWLIST}")
    if problems:
        print(f"check_sizes: {len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    print(
        f"check_sizes: files ≤ {FILE_LIMIT} lines but {len(seen_files)} allowlisted, "
        f"{len(seen_fns)} allowlisted long functions"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
