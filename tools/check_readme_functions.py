#!/usr/bin/env python3
"""Every function README.md's "Follow one request" names must exist.

The section is the text from a heading containing "Follow one request" to the next heading. In
it, a function is named in backticks as `path/to/file.rs: fn_name` (looked up in that file) or
`fn_name()` (looked up anywhere under src/). Each is checked with the regex `fn NAME\\b`. Exits
non-zero listing the names not found. Standard library only; run from anywhere.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTION = "Follow one request"
IN_FILE = re.compile(r"`([\w./-]+\.rs): (\w+)`")
ANYWHERE = re.compile(r"`(\w+)\(\)`")


def section(text):
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("#") and SECTION in l), None)
    if start is None:
        return None
    body = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        body.append(line)
    return "\n".join(body)


def defined(name, files):
    pattern = re.compile(r"\bfn " + re.escape(name) + r"\b")
    return any(pattern.search(f.read_text(encoding="utf-8", errors="replace")) for f in files)


def main():
    readme = ROOT / "README.md"
    text = section(readme.read_text(encoding="utf-8"))
    if text is None:
        print(f"check_readme_functions: README.md has no '{SECTION}' heading", file=sys.stderr)
        return 1
    src_files = sorted((ROOT / "src").rglob("*.rs"))
    missing, checked = [], 0
    for path, name in IN_FILE.findall(text):
        checked += 1
        file = ROOT / path
        if not file.is_file():
            missing.append(f"{path}: {name} (no such file)")
        elif not defined(name, [file]):
            missing.append(f"{path}: {name}")
    for name in ANYWHERE.findall(text):
        checked += 1
        if not defined(name, src_files):
            missing.append(f"{name}() (not under src/)")
    if checked == 0:
        print(f"check_readme_functions: '{SECTION}' names no function", file=sys.stderr)
        return 1
    if missing:
        print(f"check_readme_functions: README.md '{SECTION}' names functions that do not exist:",
              file=sys.stderr)
        for m in missing:
            print(f"  {m}", file=sys.stderr)
        print("update the section (or the code) so each `file.rs: name` has `fn name` there",
              file=sys.stderr)
        return 1
    print(f"check_readme_functions: {checked} functions in '{SECTION}' exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
