#!/usr/bin/env python3
"""Turn text or JSONL into a ZOTOKENS file for zo-train --data, with a model's
tokenizer (its tokenizer.json), in the style of llm.c's dev/data scripts.

    python3 tools/data/prepare_tokens.py --tokenizer MODEL_DIR --input corpus.jsonl --out train.tokens

Input: a text file (one document; --split-lines makes each line one) or JSONL
(.jsonl / .json lines, the document in --field, default "text"). Each document
is encoded without special tokens and followed by the end-of-text token
(--eos, default: the tokenizer's eos from tokenizer_config.json or
config.json's eos_token_id; --eos none for nothing). The ids are written as a
ZOTOKENS file: the 32-byte header (b"ZOTOKENS", version 1, bytes per id, id
count, vocabulary size; little-endian uint32/uint32/uint64/uint32) and the ids
as uint16 when the vocabulary fits, else uint32. The vocabulary size written is
config.json's vocab_size when MODEL_DIR has one (the embedding's rows, which
may exceed the tokenizer's), else the tokenizer's; an id at or above it is
refused naming the first one.

The `tokenizers` package comes from PyPI: when it cannot be imported, the
script makes its own virtual environment (--venv, default
~/.cache/zoffload/prepare-venv), installs it there and runs itself again
inside it.
"""
import argparse
import json
import os
import stat
import struct
import subprocess
import sys
import venv

MAGIC = b"ZOTOKENS"
VERSION = 1
DEFAULT_VENV = os.path.join(os.path.expanduser("~"), ".cache", "zoffload", "prepare-venv")


def ensure_tokenizers(venv_dir):
    """Import tokenizers, or re-run this script in a venv that has it."""
    try:
        import tokenizers  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("ZO_PREPARE_IN_VENV"):
        sys.exit("prepare_tokens: 'tokenizers' is still missing inside %s" % venv_dir)
    py = os.path.join(venv_dir, "bin", "python3")
    if not os.path.exists(py):
        print("prepare_tokens: creating %s and installing tokenizers from PyPI" % venv_dir,
              file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(venv_dir)
        subprocess.check_call([py, "-m", "pip", "install", "--quiet", "tokenizers"])
    env = dict(os.environ, ZO_PREPARE_IN_VENV="1")
    os.execve(py, [py] + sys.argv, env)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def tokenizer_files(arg):
    """tokenizer.json, and the directory holding it (for the configs)."""
    if os.path.isdir(arg):
        path = os.path.join(arg, "tokenizer.json")
        if not os.path.exists(path):
            sys.exit("prepare_tokens: %s has no tokenizer.json" % arg)
        return path, arg
    return arg, os.path.dirname(arg) or "."


def eos_id(tok, model_dir, choice):
    if choice == "none":
        return None
    if choice:
        i = tok.token_to_id(choice)
        if i is None:
            sys.exit("prepare_tokens: --eos %r is not a token of the tokenizer" % choice)
        return i
    tc = read_json(os.path.join(model_dir, "tokenizer_config.json")) or {}
    e = tc.get("eos_token")
    if isinstance(e, dict):
        e = e.get("content")
    if isinstance(e, str) and tok.token_to_id(e) is not None:
        return tok.token_to_id(e)
    cfg = read_json(os.path.join(model_dir, "config.json")) or {}
    e = cfg.get("eos_token_id")
    if isinstance(e, list):
        e = e[0] if e else None
    if isinstance(e, int):
        return e
    sys.exit("prepare_tokens: no end-of-text token found (tokenizer_config.json eos_token, "
             "config.json eos_token_id): pass --eos TOKEN or --eos none")


def open_input(path):
    """The input as a binary file: a regular file only (a FIFO would block the open, a
    directory fails later), refused with a message, never a traceback."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        sys.exit("prepare_tokens: --input %s: %s" % (path, e.strerror))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "not a regular file"
        sys.exit("prepare_tokens: --input %s is %s: expected a regular file" % (path, what))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def decode(raw, path, offset, errors):
    """UTF-8 text of raw (bytes at offset in path): invalid bytes are refused naming their
    offset, or replaced by U+FFFD with --encoding-errors replace."""
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        sys.exit("prepare_tokens: %s: byte offset %d (0x%02x) is not UTF-8: convert the file to "
                 "UTF-8, or pass --encoding-errors replace to read such bytes as U+FFFD"
                 % (path, offset + e.start, raw[e.start]))


def documents(path, field, split_lines, errors="strict"):
    with open_input(path) as f:
        if path.endswith(".jsonl") or path.endswith(".json"):
            offset = 0
            for n, raw in enumerate(f, 1):
                line = decode(raw, path, offset, errors)
                offset += len(raw)
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit("prepare_tokens: %s:%d: not JSON: %s" % (path, n, e))
                if not isinstance(doc, dict) or not isinstance(doc.get(field), str):
                    sys.exit("prepare_tokens: %s:%d: no string field %r" % (path, n, field))
                yield doc[field]
        elif split_lines:
            offset = 0
            for raw in f:
                line = decode(raw, path, offset, errors)
                offset += len(raw)
                if line.strip():
                    yield line.rstrip("\n")
        else:
            yield decode(f.read(), path, 0, errors)


def check_out(path):
    """--out must be a file path whose directory can take it (checked before the work)."""
    if os.path.isdir(path):
        sys.exit("prepare_tokens: --out %s is a directory: expected a file path" % path)
    d = os.path.dirname(path) or "."
    if not os.path.isdir(d):
        sys.exit("prepare_tokens: --out %s: the directory %s does not exist" % (path, d))
    if not os.access(d, os.W_OK | os.X_OK):
        sys.exit("prepare_tokens: --out %s: the directory %s is not writable" % (path, d))


def write_tokens(path, ids, vocab):
    width = 2 if vocab <= 65536 else 4
    for pos, i in enumerate(ids):
        if i >= vocab:
            sys.exit("prepare_tokens: id %d at position %d is not below the vocabulary size %d"
                     % (i, pos, vocab))
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<IIQI", VERSION, width, len(ids), vocab) + b"\0" * 4)
            fmt = "<%d%s" % (len(ids), "H" if width == 2 else "I")
            f.write(struct.pack(fmt, *ids))
        os.replace(tmp, path)
    except OSError as e:
        sys.exit("prepare_tokens: cannot write --out %s: %s" % (path, e.strerror))
    finally:  # a failed or interrupted write leaves no temporary file behind
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return width


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a model directory or its tokenizer.json")
    ap.add_argument("--input", required=True, help="a text file, or JSONL (.jsonl)")
    ap.add_argument("--out", required=True, help="the ZOTOKENS file to write")
    ap.add_argument("--field", default="text", help="the JSONL field holding a document")
    ap.add_argument("--split-lines", action="store_true", help="each line of a text file is a document")
    ap.add_argument("--eos", help="the token after each document (default: the model's; none: no token)")
    ap.add_argument("--vocab", type=int, help="the vocabulary size to write (default: config.json's)")
    ap.add_argument("--venv", default=DEFAULT_VENV, help="where to install tokenizers if needed")
    ap.add_argument("--encoding-errors", choices=("strict", "replace"), default="strict",
                    help="input bytes that are not UTF-8: strict refuses them naming the byte "
                         "offset (default); replace reads each as U+FFFD")
    a = ap.parse_args()
    check_out(a.out)
    ensure_tokenizers(a.venv)
    from tokenizers import Tokenizer

    tok_path, model_dir = tokenizer_files(a.tokenizer)
    tok = Tokenizer.from_file(tok_path)
    cfg = read_json(os.path.join(model_dir, "config.json")) or {}
    vocab = a.vocab or cfg.get("vocab_size") or tok.get_vocab_size(with_added_tokens=True)
    eos = eos_id(tok, model_dir, a.eos)
    ids, docs = [], 0
    for text in documents(a.input, a.field, a.split_lines, a.encoding_errors):
        ids.extend(tok.encode(text, add_special_tokens=False).ids)
        if eos is not None:
            ids.append(eos)
        docs += 1
    width = write_tokens(a.out, ids, vocab)
    print("prepare_tokens: %d documents, %d tokens (uint%d, vocabulary %d) -> %s"
          % (docs, len(ids), 8 * width, vocab, a.out))


if __name__ == "__main__":
    main()
