#!/usr/bin/env bash
# prepare_tokens.py against ids worked out by hand: a word-level tokenizer.json
# of five tokens, JSONL in, the ZOTOKENS header and ids out, byte for byte; an
# id at or above --vocab refused naming it. Skipped (77) without `tokenizers`.
set -euo pipefail
script=$1
py=python3
if [ -n "${ZO_PREPARE_VENV:-}" ] && [ -x "$ZO_PREPARE_VENV/bin/python3" ]; then
  py=$ZO_PREPARE_VENV/bin/python3
fi
if ! "$py" -c 'import tokenizers' 2>/dev/null; then
  echo "skipped: no Python with the tokenizers package (set ZO_PREPARE_VENV to a venv that has it)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/model"
cat >"$dir/model/tokenizer.json" <<'JSON'
{"version": "1.0", "truncation": null, "padding": null,
 "added_tokens": [{"id": 0, "content": "</s>", "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true}],
 "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
 "decoder": null,
 "model": {"type": "WordLevel", "vocab": {"</s>": 0, "[UNK]": 1, "the": 2, "cat": 3, "sat": 4},
           "unk_token": "[UNK]"}}
JSON
echo '{"eos_token": "</s>"}' >"$dir/model/tokenizer_config.json"
printf '{"text": "the cat sat"}\n{"text": "the dog"}\n' >"$dir/in.jsonl"
"$py" "$script" --tokenizer "$dir/model" --input "$dir/in.jsonl" --out "$dir/out.tokens"
# the cat sat </s> the [UNK] </s>: 7 uint16 ids, vocabulary 5
want='5a4f544f4b454e530100000002000000070000000000000005000000000000000200030004000000020001000000'
have=$(od -An -v -tx1 "$dir/out.tokens" | tr -d ' \n')
[ "$have" = "$want" ] || { echo "FAIL: out.tokens is $have, expected $want"; exit 1; }
if "$py" "$script" --tokenizer "$dir/model" --input "$dir/in.jsonl" --out "$dir/bad.tokens" \
  --vocab 4 2>"$dir/err.txt"; then
  echo "FAIL: an id above --vocab 4 was accepted"; exit 1
fi
grep -q "id 4 at position 2 is not below the vocabulary size 4" "$dir/err.txt" ||
  { echo "FAIL: the refusal does not name the id:"; cat "$dir/err.txt"; exit 1; }
[ ! -e "$dir/bad.tokens" ] || { echo "FAIL: a refused file was written"; exit 1; }
echo "ok: prepare_tokens.py wrote the expected ZOTOKENS file and refused an id above the vocabulary"

# bad inputs and outputs: a message naming what is wrong, no traceback, no .tmp left behind
expect_refused() { # needle, then the arguments
  local needle=$1
  shift
  if "$py" "$script" --tokenizer "$dir/model" "$@" >"$dir/out.txt" 2>"$dir/err.txt"; then
    echo "FAIL: $* was accepted"; exit 1
  fi
  grep -qF -- "$needle" "$dir/err.txt" || { echo "FAIL: $* does not say '$needle':"; cat "$dir/err.txt"; exit 1; }
  if grep -q Traceback "$dir/err.txt"; then echo "FAIL: $* gave a traceback"; cat "$dir/err.txt"; exit 1; fi
}
printf 'the cat \xff\xfe sat\n' >"$dir/latin.txt"
expect_refused "byte offset 8 (0xff) is not UTF-8" --input "$dir/latin.txt" --out "$dir/l.tokens"
[ ! -e "$dir/l.tokens" ] || { echo "FAIL: a refused input was written"; exit 1; }
printf '{"text": "the cat"}\n{"text": "\xc3 sat"}\n' >"$dir/latin.jsonl"
expect_refused "byte offset 30 (0xc3) is not UTF-8" --input "$dir/latin.jsonl" --out "$dir/l.tokens"
"$py" "$script" --tokenizer "$dir/model" --input "$dir/latin.txt" --out "$dir/l.tokens" \
  --encoding-errors replace >/dev/null
[ -s "$dir/l.tokens" ] || { echo "FAIL: --encoding-errors replace wrote nothing"; exit 1; }
mkdir "$dir/outdir"
expect_refused "--out $dir/outdir is a directory: expected a file path" --input "$dir/in.jsonl" \
  --out "$dir/outdir"
expect_refused "the directory $dir/none does not exist" --input "$dir/in.jsonl" --out "$dir/none/x.tokens"
mkfifo "$dir/fifo"
expect_refused "is a FIFO: expected a regular file" --input "$dir/fifo" --out "$dir/f.tokens"
expect_refused "is a directory: expected a regular file" --input "$dir/outdir" --out "$dir/f.tokens"
if [ "$(id -u)" != 0 ]; then
  mkdir "$dir/ro" && chmod 500 "$dir/ro"
  expect_refused "is not writable" --input "$dir/in.jsonl" --out "$dir/ro/x.tokens"
fi
# the write itself failing (a file size limit: EFBIG): the message, and no temporary file left
# (stderr goes through a pipe: the limit applies to files the subshell writes)
set +o pipefail
(ulimit -f 0 && "$py" "$script" --tokenizer "$dir/model" --input "$dir/in.jsonl" \
  --out "$dir/big.tokens" 2>&1 >/dev/null && echo accepted || echo "exit $?") | cat >"$dir/err.txt"
set -o pipefail
grep -q "cannot write --out $dir/big.tokens" "$dir/err.txt" && grep -q "exit 1" "$dir/err.txt" ||
  { echo "FAIL: the failed write is not named:"; cat "$dir/err.txt"; exit 1; }
if ls "$dir"/*.tmp* >/dev/null 2>&1; then echo "FAIL: temporary files left: $(ls "$dir"/*.tmp*)"; exit 1; fi
echo "ok: prepare_tokens.py refused bad inputs and outputs with messages, leaving no .tmp files"
