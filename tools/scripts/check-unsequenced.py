#!/usr/bin/env python3
"""A read of a variable in the same expression as a call that takes its address, outside that call's own
arguments: `mx + logf(row_sumexp(.., &mx))`. The call's body and the read are indeterminately sequenced, so the
compiler may read the old value; nvcc did, and every loss on the first GPU run was garbage (b843c5e). The cpu
device cannot run .cu code, so this check reads the sources instead: every .c/.h/.cu/.cuh under the parts.

It is a line-by-line heuristic: statements with && || ?: (sequence points) are left to a reader, `sizeof x` is
no read, and neither is the assignment target (`x = f(&x)`) or a declarator (`int a, b = f(&a)`).
Usage: check-unsequenced.py [PATH...] (default: the parts' folders); --self-test checks the checker."""
import pathlib
import re
import sys

PARTS = ["kernels", "offload", "optim", "swap", "tools", "include"]
SOURCES = {".c", ".h", ".cu", ".cuh"}


def enclosing_call(s, i):
    """(open, close) of the parentheses directly around position i, or None."""
    depth = 0
    for o in range(i - 1, -1, -1):
        if s[o] == ")":
            depth += 1
        elif s[o] == "(":
            if depth == 0:
                break
            depth -= 1
    else:
        return None
    depth = 0
    for c in range(i, len(s)):
        if s[c] == "(":
            depth += 1
        elif s[c] == ")":
            if depth == 0:
                return o, c
            depth -= 1
    return None


def read_elsewhere(stmt, x, span):
    rest = stmt[:span[0]] + " " + stmt[span[1] + 1:]
    rest = re.sub(r"sizeof\s*\(?\s*\*?\s*[\w.>-]+\)?", " ", rest)
    rest = re.sub(r"^\s*([\w\s*]+\s)?%s\s*=(?!=)" % re.escape(x), " ", rest)
    rest = re.sub(r"(?:[\w*]\s+|,\s*|\*)%s\s*(?=[,=](?!=))" % re.escape(x), " ", rest)
    return re.search(r"(?<![&\w.>])\b%s\b(?!\s*(\(|\[|\.|->))" % re.escape(x), rest) is not None


def findings(text):
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("//")[0]
        if "&" not in code or code.lstrip().startswith(("*", "/*", "#")):
            continue
        for stmt in code.split(";"):
            if re.search(r"&&|\|\||\?", stmt):
                continue
            for m in re.finditer(r"[(,]\s*&\s*(\w+)\b(?!\s*[\[.]|\s*->)", stmt):
                span = enclosing_call(stmt, m.end())
                if span and read_elsewhere(stmt, m.group(1), span):
                    yield n, line.strip()
                    break


def self_test():
    bad = ["const float lse = mx + logf(row_sumexp(a, off, V, &mx));",
           "y = g(x, f(&x));", "return n * count(&n);"]
    good = ["const float sum = row_sumexp(a, off, V, &mx);", "ms = strtoull(end + 1, &end, 10);",
            "x = f(&x);", "int a, b = f(&a);", "memcpy(&u, &f, sizeof u);",
            "if (f(&x) && x > 0) return;", "zo_status st = zo_stream_enqueue(s, fn, &t, sizeof t);"]
    wrong = [s for s in bad if not list(findings(s))] + [s for s in good if list(findings(s))]
    for s in wrong:
        print(f"check-unsequenced: self-test: misjudged: {s}")
    return 1 if wrong else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    root = pathlib.Path(__file__).resolve().parents[2]
    paths = [pathlib.Path(a) for a in argv] or [root / p for p in PARTS]
    hits = 0
    for top in paths:
        files = sorted(top.rglob("*")) if top.is_dir() else [top]
        for p in files:
            if p.suffix in SOURCES and p.is_file():
                for n, line in findings(p.read_text(errors="replace")):
                    print(f"{p}:{n}: a variable is read beside a call that takes its address (the order "
                          f"is unspecified): compute the call in its own statement first: {line}")
                    hits += 1
    if hits:
        return 1
    print(f"check-unsequenced: no read beside a call taking the same variable's address in {', '.join(map(str, paths))}")
    return self_test()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
