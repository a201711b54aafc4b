#!/usr/bin/env python3
"""The exported API is the public headers: fails when libzoffload.so exports
a function or object that no installed header declares, or when an installed
header declares one that the library does not export (a missing ZO_API, a
missing definition), and when the library holds a test hook at all, exported
or not (the parts' testing headers: their functions live in the parts'
*_testing targets, which only test programs link), or when a shipped program
(the tools, which link the static parts) holds one.

Usage: check-exports.py LIB HEADER... [--optional HEADER...] [--hooks HEADER...]
                        [--programs PROGRAM...]
  LIB       the shared library (nm -D --defined-only reads its exports,
            nm --defined-only every symbol it defines)
  HEADER    the installed headers
  optional  installed headers whose functions this build may lack (the CUDA
            kernels in a build without CUDA)
  hooks     testing headers: none of their functions may be in the library
  programs  shipped executables: none of the hooks may be in them either
"""
import re
import subprocess
import sys

# Symbols the toolchain defines in every shared object.
LINKER_SYMBOLS = {'_init', '_fini', '_edata', '_end', '__bss_start', '_DYNAMIC', '_GLOBAL_OFFSET_TABLE_'}


def blank(m):
    """A comment or preprocessor line replaced by spaces, so offsets stay put."""
    return re.sub(r'[^\n]', ' ', m.group(0))


def code_of(text):
    """The header's C text: no comments, no preprocessor lines, no C++ guards."""
    text = re.sub(r'/\*.*?\*/|//[^\n]*', blank, text, flags=re.S)
    text = re.sub(r'#ifdef __cplusplus.*?#endif', blank, text, flags=re.S)
    return re.sub(r'^[ \t]*#(?:[^\n]*\\\n)*[^\n]*', blank, text, flags=re.M)


def top_level_statements(code):
    """(start, text) of each statement at file scope; a braced body belongs to
    the statement around it (struct, enum, inline function)."""
    out, depth, start = [], 0, None
    for i, ch in enumerate(code):
        if start is None and not ch.isspace():
            start = i
        if ch == '{':
            depth += 1
        elif ch == '}':
            depth -= 1
            if depth == 0 and code[start:i].lstrip().startswith('static'):
                out.append((start, code[start:i + 1]))  # an inline function's body ends it
                start = None
        elif ch == ';' and depth == 0 and start is not None:
            out.append((start, code[start:i + 1]))
            start = None
    return out


def declarations(text):
    """(name, kind, offset) of each function and object a header declares for
    the library to define: not typedefs, not static inline functions."""
    decls = []
    for start, stmt in top_level_statements(code_of(text)):
        s = ' '.join(stmt.split())
        if s.startswith(('typedef', 'static', 'enum', 'struct')) and '(' not in s.split('{')[0]:
            continue
        if s.startswith(('typedef', 'static')):
            continue
        if '{' in s:  # a struct or enum definition
            continue
        m = re.match(r'[^(]*?\b([A-Za-z_]\w*)\s*\(', s)
        if m:
            decls.append((m.group(1), 'function', start))
        elif s.startswith('extern'):
            decls.append((re.findall(r'[A-Za-z_]\w*', s.split('[')[0].split('=')[0])[-1], 'object', start))
    return decls


def defined(lib, dynamic):
    """The symbols lib defines: its exports (dynamic) or all, local ones too."""
    cmd = ['nm', '-D', '--defined-only', lib] if dynamic else ['nm', '--defined-only', lib]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    names = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ('TDBRVWGSi' if dynamic else 'TDBRVWGSitdbrs') \
                and parts[2] not in LINKER_SYMBOLS:
            names[parts[2].split('@')[0]] = parts[1]
    return names


def exports(lib):
    return defined(lib, True)


def split_args(rest):
    """The headers, the optional ones and the hooks' headers of the arguments."""
    groups, key = {'': [], '--optional': [], '--hooks': [], '--programs': []}, ''
    for a in rest:
        if a in groups:
            key = a
        else:
            groups[key].append(a)
    return groups[''], groups['--optional'], groups['--hooks'], groups['--programs']


def hooks_held(lib, hook_headers):
    """(name, header) of each test hook the library defines, exported or not."""
    held = defined(lib, False)
    return sorted((name, h) for h in hook_headers for name, kind, _ in declarations(open(h).read())
                  if name in held)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    lib = argv[1]
    headers, optional, hook_headers, programs = split_args(argv[2:])
    declared, maybe = {}, set()
    for h in headers + optional:
        for name, kind, _ in declarations(open(h).read()):
            declared[name] = h
            if h in optional:
                maybe.add(name)
    exported = exports(lib)
    extra = sorted(n for n in exported if n not in declared)
    missing = sorted(n for n in declared if n not in exported and n not in maybe)
    for n in extra:
        print('exported but in no installed header: %s (nm type %s)' % (n, exported[n]))
    for n in missing:
        print('declared in %s but not exported: %s' % (declared[n], n))
    hooks = hooks_held(lib, hook_headers)
    for n, h in hooks:
        print('a test hook in the library: %s (declared in %s; it belongs in the part\'s _testing target)' % (n, h))
    for prog in programs:
        held = hooks_held(prog, hook_headers)
        for n, h in held:
            print('a test hook in %s: %s (declared in %s; a shipped program links no _testing target)' % (prog, n, h))
        hooks += held
    print('check-exports: %d exported, %d declared in %d installed headers; %d not declared, %d not exported; '
          '%d test hooks held (%d testing headers, the library and %d programs)'
          % (len(exported), len(declared), len(headers) + len(optional), len(extra), len(missing), len(hooks),
             len(hook_headers), len(programs)))
    return 1 if extra or missing or hooks else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
