// Prints the ids of OpenAI's tiktoken (`gpt2` encoding, ordinary text: no
// special tokens) for each document of a file, as one JSON array of arrays.
// Usage: node tiktoken_encode.js FILE SEPARATOR
const fs = require("fs");
const { get_encoding } = require("tiktoken");

const [file, separator] = process.argv.slice(2);
const enc = get_encoding("gpt2");
const docs = fs.readFileSync(file, "utf8").split(separator).filter((d) => d.length > 0);
process.stdout.write(JSON.stringify(docs.map((d) => Array.from(enc.encode_ordinary(d)))));
enc.free();
