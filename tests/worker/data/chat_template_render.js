// Renders conversations with a model's published chat template through
// @huggingface/jinja (what transformers' apply_chat_template does, in
// JavaScript) and tokenizes the text with @lenml/tokenizers, special tokens
// found in it as transformers finds them. Prints one JSON array of
// {text, ids}.
// A {prompt, completion} item instead is one document: the two texts as one,
// with the tokenizer's own special tokens (its post-processor's BOS).
// Usage: node chat_template_render.js TOKENIZER_DIR CONVERSATIONS_JSON [TEMPLATE_FILE]
// TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json (whose
// chat_template is used unless TEMPLATE_FILE gives another). CHAT_DATE, when
// set, is the templates' date_string (Llama 3.1's "Today Date").
const fs = require("fs");
const path = require("path");
const { Template } = require("@huggingface/jinja");
const { TokenizerLoader } = require("@lenml/tokenizers");

const [dir, conversationsPath, templatePath] = process.argv.slice(2);
const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: {},
});
const source = templatePath ? fs.readFileSync(templatePath, "utf8") : config.chat_template;
const template = new Template(source);
const conversations = JSON.parse(fs.readFileSync(conversationsPath, "utf8"));
const out = conversations.map((messages) => {
  if (!Array.isArray(messages)) {
    const text = messages.prompt + messages.completion;
    return { text, ids: tokenizer.encode(text, { add_special_tokens: true }) };
  }
  const text = template.render({
    messages,
    bos_token: config.bos_token || "",
    eos_token: config.eos_token || "",
    add_generation_prompt: false,
    ...(process.env.CHAT_DATE ? { date_string: process.env.CHAT_DATE } : {}),
  });
  return { text, ids: tokenizer.encode(text, { add_special_tokens: false }) };
});
process.stdout.write(JSON.stringify(out));
