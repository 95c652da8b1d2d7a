#!/usr/bin/env python3
"""The plugin's import shape, checked: imports run one way, down the layers named below.

Reads every production file of `src/` (tests and `testing.rs` are left out: a test may reach
anywhere), collects the `crate::…` paths its code names (`use` lines and paths in expressions;
comments and doc links are not imports) and fails, naming file, line and path, when

* a file imports a top-level module on a higher layer than its own (an upward import), or one
  that is not listed in LAYERS (a new module must be placed), or
* files import each other in a circle (the strongly connected components of the file graph,
  resolved to the file that defines the path named).

Within one top-level module, files may use each other freely as long as they form no circle.
Run by `make lint`; `python3 tools/check_layers.py --show` prints the layers and each module's
imports.
"""
import os
import re
import sys

# Bottom to top: a module may import the modules listed before it, never those after it.
LAYERS = [
    # vocabulary every section and component shares; stat names; the proxy port; owned headers
    "common",
    "metrics",
    "port",
    "headers",
    "headermap",
    # the OpenAI-style protocol: request parsing, body edits, usage reports
    "protocol",
    # what the gateway knows about a pod: metrics pages, served models, the load table
    "pod",
    "health",
    # what VMs share in the host's shared data: rows, messages, the leader lease
    "state",
    # flow control's queue of held requests, when a pod counts as full, and the held board
    "admission",
    # prefix affinity: block hashing, the prefix index, this VM's belief of what each pod holds
    "affinity",
    # work in flight, per pod: the board VMs share and this VM's book
    "work",
    # how fast each pod works: the learned cost model, pod speeds, calibration, the fits board
    "cost",
    # LoRA adapters: which pods hold which, what loading one costs
    "adapters",
    # which pod stored a Responses API answer
    "stored_responses",
    # filters, the TTFT predictor, the picker; then the P/D split decision
    "scheduler",
    "pd",
    # what gateway replicas exchange
    "peers",
    # the whole configuration (wire form and compile), above every section it assembles
    "config",
    # one VM's routing state, its leader/follower step, one request's path, the proxy binding
    "router",
    "vm",
    "flow",
    "host",
]

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
CRATE_PATH = re.compile(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*|\{)")
SUPER_PATH = re.compile(r"\b((?:super::)+)((?:[a-z_][a-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*)")


def outside_tests(lines):
    """`lines` with those of `#[cfg(test)] mod name { … }` blocks (closed by a `}` in column 0)
    replaced by None, so line numbers hold (`check_sizes.py` uses it too)."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]":
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith("#["):
                j += 1
            if j < len(lines) and re.match(r"(pub(\([a-z]+\))? )?mod [a-z_]+ \{$", lines[j].strip()):
                while j < len(lines) and lines[j] != "}":
                    j += 1
                out.extend([None] * (j + 1 - i))
                i = j + 1
                continue
        out.append(lines[i])
        i += 1
    return out


def production_lines(path):
    """The file's lines outside test modules, comments blanked, a test line left empty."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    return ["" if line is None else line.split("//", 1)[0] for line in outside_tests(lines)]


def module_path(rel):
    """`flow/parse/chat.rs` -> ['flow', 'parse', 'chat']; `vm/mod.rs` -> ['vm']."""
    parts = rel[:-3].split("/")
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def resolve(segments, files):
    """The file that defines the longest prefix of `segments` that is a module."""
    for n in range(len(segments), 0, -1):
        base = "/".join(segments[:n])
        for candidate in (base + ".rs", base + "/mod.rs"):
            if candidate in files:
                return candidate
    return None


def group_paths(text, start):
    """The paths inside `crate::{…}` starting at `start` (just after the brace), nested once."""
    depth, i, prefix_stack, current, paths = 1, start, [""], "", []
    while i < len(text) and depth > 0:
        c = text[i]
        if c == "{":
            prefix_stack.append(prefix_stack[-1] + current.strip())
            current = ""
            depth += 1
        elif c == "}":
            if current.strip():
                paths.append(prefix_stack[-1] + current.strip())
            current = ""
            prefix_stack.pop()
            depth -= 1
        elif c == ",":
            if current.strip():
                paths.append(prefix_stack[-1] + current.strip())
            current = ""
        else:
            current += c
        i += 1
    return [p for p in paths if p and p != "self"]


def imports_of(rel, files):
    lines = production_lines(os.path.join(SRC, rel))
    text = "\n".join(lines)
    found = []  # (line, path segments)
    for m in CRATE_PATH.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group(1) == "{":
            for p in group_paths(text, m.end()):
                found.append((line, p.split("::")))
        else:
            found.append((line, m.group(1).split("::")))
    here = module_path(rel)

    for m in SUPER_PATH.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        ups = m.group(1).count("super::")
        # A `foo.rs` or `foo/mod.rs` file is module `foo`: `super` is its parent.
        base = here[: len(here) - ups]
        found.append((line, base + m.group(2).split("::")))
    edges = []
    for line, segments in found:
        segments = [s for s in segments if s]
        target = resolve(segments, files)
        if target and target != rel:
            edges.append((line, "::".join(segments), target))
    return edges


def circles(graph):
    """Tarjan's strongly connected components of more than one file."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    files = set()
    for root, _, names in os.walk(SRC):
        for name in names:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, name), SRC).replace(os.sep, "/")
            if name == "tests.rs" or name.endswith("_tests.rs") or rel in ("testing.rs", "lib.rs"):
                continue
            files.add(rel)
    rank = {m: i for i, m in enumerate(LAYERS)}
    problems, graph, module_imports = [], {}, {}
    for rel in sorted(files):
        own = rel.split("/")[0].removesuffix(".rs")
        if own not in rank:
            problems.append(f"src/{rel}: module `{own}` has no layer: add it to LAYERS in {__file__}")
            continue
        for line, path, target in imports_of(rel, files):
            graph.setdefault(rel, set()).add(target)
            other = target.split("/")[0].removesuffix(".rs")
            if other == own:
                continue
            module_imports.setdefault(own, set()).add(other)
            if other not in rank:
                problems.append(f"src/{rel}:{line}: imports `crate::{path}`, module `{other}` has no layer")
            elif rank[other] > rank[own]:
                problems.append(
                    f"src/{rel}:{line}: imports `crate::{path}` upward "
                    f"(`{other}` is on layer {rank[other]}, `{own}` on {rank[own]})"
                )
    for comp in circles(graph):
        problems.append("import circle: " + " -> ".join("src/" + f for f in comp))
    if "--show" in sys.argv:
        for m in LAYERS:
            print(f"{rank[m]:2} {m}: {', '.join(sorted(module_imports.get(m, ())))}")
    if problems:
        print(f"check_layers: {len(problems)} problem(s) in the import shape of src/:")
        for p in problems:
            print("  " + p)
        return 1
    print(f"check_layers: {len(files)} files, {len(LAYERS)} layers, no upward import, no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
