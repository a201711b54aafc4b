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
