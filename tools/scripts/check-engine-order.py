#!/usr/bin/env python3
"""The engine's call order: fails when a file of offload/engine calls a file
that engine_internal.h lists above it or on its own line, or when a file is
missing from that list (a cycle between files is always such a call).

The order is read from the comment that opens engine_internal.h, one line a
rank from the top: each line starts with the files of one rank, separated by
commas, and a file calls only the files of the lines below it. A call is a
symbol one object file leaves undefined (nm) that another defines, so calls
through the mode and tier tables (function pointers) are not calls here,
and a reference to another file's table or variable is.

Usage: check-engine-order.py HEADER OBJECT... [--nm NM]
  HEADER    offload/engine/engine_internal.h
  OBJECT    the engine's object files (engine_api.c.o ...), or ;-lists of them
  NM        the nm to run (default: nm)
"""
import os
import re
import subprocess
import sys

# The start of an entry: the files of one rank, after the comment's " *   ".
ENTRY = re.compile(r'^ \*   (engine\w*\.c(?:, engine\w*\.c)*)(?:\s|$)')


def documented_ranks(header):
    """{file: rank} from the header's opening comment, 0 at the top."""
    with open(header) as f:
        text = f.read()
    comment = text[:text.index('*/')]
    rank, lines = {}, 0
    for line in comment.splitlines():
        m = ENTRY.match(line)
        if m:
            for name in m.group(1).split(', '):
                rank[name] = lines
            lines += 1
    return rank


def symbols(nm, obj):
    """(defined, undefined) global symbols of one object file."""
    out = subprocess.run([nm, '-P', obj], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        name, kind = line.split()[:2]
        if kind == 'U':
            undefined.add(name)
        elif kind.isupper():
            defined.add(name)
    return defined, undefined


def calls_between_files(nm, objects):
    """{(caller, callee): [symbol, ...]} between distinct source files."""
    defs, undefs = {}, {}
    for obj in objects:
        source = os.path.basename(obj)
        source = source[:-len('.o')] if source.endswith('.o') else source
        defs[source], undefs[source] = symbols(nm, obj)
    owner = {s: f for f, names in defs.items() for s in names}
    calls = {}
    for caller, names in undefs.items():
        for s in sorted(names):
            if s in owner and owner[s] != caller:
                calls.setdefault((caller, owner[s]), []).append(s)
    return calls, sorted(defs)


def cycles(calls):
    """The groups of files that call each other around (strongly connected,
    more than one file), each sorted."""
    graph = {}
    for a, b in calls:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    groups = {frozenset(f for f in graph if f in reach[a] and a in reach[f]) | {a}
              for a in graph if a in reach[a]}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def unlisted(rank, files, where):
    """The files the order misses, and the names it lists without an object."""
    out = ['%s is not in the order at the top of %s: add it where its calls allow' % (f, where)
           for f in files if f not in rank]
    out += ['%s is in the order at the top of %s but has no object: drop it' % (f, where)
            for f in sorted(set(rank) - set(files))]
    return out


def against_order(rank, calls, where):
    """Each call to a file listed beside or above the caller, named."""
    out = []
    for (a, b), names in sorted(calls.items()):
        if a in rank and b in rank and rank[b] <= rank[a]:
            out.append('%s calls %s (%s), which %s lists %s it: a file calls only the files '
                       'listed below it' % (a, b, ', '.join(names), where,
                                            'beside' if rank[a] == rank[b] else 'above'))
    return out


def main(argv):
    nm = 'nm'
    if '--nm' in argv:
        i = argv.index('--nm')
        nm = argv[i + 1]
        del argv[i:i + 2]
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    header = argv[1]
    objects = [o for arg in argv[2:] for o in arg.split(';')]  # ctest's $<TARGET_OBJECTS>: one list
    rank = documented_ranks(header)
    calls, files = calls_between_files(nm, objects)
    where = os.path.basename(header)
    against = against_order(rank, calls, where)
    around = cycles(calls)
    problems = unlisted(rank, files, where) + against
    problems += ['these files call each other around: %s' % ', '.join(g) for g in around]
    for p in problems:
        print('check-engine-order: ' + p, file=sys.stderr)
    if problems:
        print('check-engine-order: %d of %d calls between files against the order, %d cycle(s)' %
              (len(against), len(calls), len(around)), file=sys.stderr)
        return 1
    print('check-engine-order: %d files, %d calls between them, all down the order of %s' %
          (len(files), len(calls), where))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
