// Prints the ids the reference tokenizers give for each document of a file,
// as one JSON array of arrays: @lenml/tokenizers (transformers.js's
// tokenizers) on a tokenizer.json, or tiktoken with a rank file and pattern.
// Usage: node hf_tokenizer_encode.js hf TOKENIZER_JSON FILE SEPARATOR [special|ordinary]
//        node hf_tokenizer_encode.js tiktoken RANKS_JSON FILE SEPARATOR
// (RANKS_JSON: {"ranks": "<tiktoken file text>", "pattern": "..."})
const fs = require("fs");

const [kind, tokenizerPath, file, separator, mode] = process.argv.slice(2);
const docs = fs.readFileSync(file, "utf8").split(separator).filter((d) => d.length > 0);
let out;
if (kind === "hf") {
  const { TokenizerLoader } = require("@lenml/tokenizers");
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(tokenizerPath, "utf8")),
    tokenizerConfig: {},
  });
  out = docs.map((d) => tokenizer.encode(d, { add_special_tokens: false }));
  if (mode === "ordinary") throw new Error("ordinary mode is pstar's own; the reference always finds added tokens");
} else if (kind === "tiktoken") {
  const { Tiktoken } = require("tiktoken");
  const spec = JSON.parse(fs.readFileSync(tokenizerPath, "utf8"));
  const enc = new Tiktoken(spec.ranks, {}, spec.pattern);
  out = docs.map((d) => Array.from(enc.encode_ordinary(d)));
  enc.free();
} else {
  throw new Error("kind must be hf or tiktoken");
}
process.stdout.write(JSON.stringify(out));
