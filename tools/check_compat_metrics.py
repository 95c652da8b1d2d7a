#!/usr/bin/env python3
"""docs/compatibility.md's engine table names exactly the engine metrics kvroute reads.

The table is the one whose header has a column "metrics kvroute reads"; every engine metric name
in that column (`vllm:…`, `sglang:…`, `llamacpp:…`, `trtllm_…`, `tgi_…`) must be a string literal
in the production code of src/pod/ (each file's lines before its `#[cfg(test)]`), and every such
literal there must be in the column: a renamed, added or misspelt metric fails either way.
Exits non-zero listing each difference. Standard library only; run from anywhere. Run by
`make lint`.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "compatibility.md"
SRC = ROOT / "src" / "pod"
COLUMN = "metrics kvroute reads"
NAME = r"(?:vllm|sglang|llamacpp):[a-z_]+|(?:trtllm|tgi)_[a-z_]+"
IN_DOC = re.compile(r"`(" + NAME + r")")
IN_SRC = re.compile(r'"(' + NAME + r')"')


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def documented(text):
    """The names in the column, or None when no table has it."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|") or COLUMN not in line:
            continue
        col = next(j for j, c in enumerate(cells(line)) if COLUMN in c)
        names = set()
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            row_cells = cells(row)
            if col < len(row_cells):
                names.update(IN_DOC.findall(row_cells[col]))
        return names
    return None


def read_in_source():
    names = {}
    for path in sorted(SRC.glob("*.rs")):
        production = path.read_text(encoding="utf-8").split("#[cfg(test)]")[0]
        for name in IN_SRC.findall(production):
            names.setdefault(name, path.relative_to(ROOT))
    return names


def main():
    doc = documented(DOC.read_text(encoding="utf-8"))
    if doc is None:
        sys.exit(f"check_compat_metrics: no table with a '{COLUMN}' column in {DOC.relative_to(ROOT)}")
    src = read_in_source()
    problems = [f"{name}: in docs/compatibility.md, not read in src/pod/" for name in sorted(doc - set(src))]
    problems += [f"{name}: read in {src[name]}, missing from docs/compatibility.md"
                 for name in sorted(set(src) - doc)]
    for problem in problems:
        print(f"check_compat_metrics: {problem}")
    if problems:
        sys.exit(f"check_compat_metrics: {len(problems)} difference(s) between the engine table "
                 "and src/pod/")
    print(f"check_compat_metrics: the {len(doc)} engine metrics of docs/compatibility.md are "
          "those src/pod/ reads")


if __name__ == "__main__":
    main()
