#!/usr/bin/env python3
"""Lists Rust functions longer than a limit (default 150 lines) outside tests.

The house rule (docs/architecture.md) is no function over about 150 lines: a long loop becomes a
struct with one method per event. This is a rough scan, not a parser: it finds `fn` items by
their signature line, matches braces (ignoring those in strings, chars and comments) and skips
`#[cfg(test)]` modules and the `tests/`, `examples/` and `benches/` folders.

    python3 scripts/fn-lengths.py [--limit 150] [paths...]
"""
import argparse
import os
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")


def strip(line, state):
    """Removes strings, char literals and comments; `state` carries a block comment across lines."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out)
            state["block"], i = False, end + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"], i = True, i + 2
            continue
        if c == '"':
            i += 1
            while i < n and line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            i += 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:i + 4]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:i + 4]).group(0))
            continue
        out.append(c)
        i += 1
    return "".join(out)


def scan(path, limit):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    state, found = {"block": False}, []
    test_depth = None  # brace depth at which a #[cfg(test)] module ends
    depth, pending_test = 0, False
    stack = []  # (name, start line, depth at open)
    for lineno, raw in enumerate(lines, 1):
        if "#[cfg(test)]" in raw:
            pending_test = True
        code = strip(raw, state)
        m = FN.match(code)
        if m and test_depth is None:
            stack.append([m.group(7), lineno, None])
        for ch in code:
            if ch == "{":
                if pending_test and test_depth is None:
                    test_depth, pending_test = depth, False
                for s in stack:
                    if s[2] is None:
                        s[2] = depth
                depth += 1
            elif ch == "}":
                depth -= 1
                if test_depth is not None and depth == test_depth:
                    test_depth = None
                while stack and stack[-1][2] is not None and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    length = lineno - start + 1
                    if length > limit:
                        found.append((length, path, start, name))
        if code.strip().endswith(";") and stack and stack[-1][2] is None:
            stack.pop()  # a declaration without a body (trait method)
        if pending_test and code.strip().endswith(";"):
            pending_test = False  # `#[cfg(test)] use ...;` opens no module
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=150)
    ap.add_argument("paths", nargs="*", default=["agent/src", "coordinator/src", "proto/src", "core/src", "tests/src"])
    args = ap.parse_args()
    found = []
    for root in args.paths:
        for dirpath, _, files in os.walk(root):
            if any(part in ("tests", "examples", "benches") for part in dirpath.split(os.sep)):
                continue
            for f in files:
                if f.endswith(".rs"):
                    found += scan(os.path.join(dirpath, f), args.limit)
    for length, path, start, name in sorted(found, reverse=True):
        print(f"{length:5} {path}:{start} {name}")
    print(f"{len(found)} functions over {args.limit} lines", file=sys.stderr)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
