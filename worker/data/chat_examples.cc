#include "worker/data/chat_examples.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "worker/data/utf8.h"

namespace pstar {

namespace {

using Role = ChatMessage::Role;

const char* RoleName(Role r) {
  switch (r) {
    case Role::kSystem: return "system";
    case Role::kUser: return "user";
    case Role::kAssistant: return "assistant";
  }
  return "user";
}

bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The first byte past leading whitespace, and one past the last non-space.
size_t SkipSpaceForward(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Char c = DecodeUtf8At(s, i);
    if (c.cp == Utf8Char::kInvalid || !IsPythonSpace(c.cp)) break;
    i += c.len;
  }
  return i;
}

size_t SkipSpaceBackward(std::string_view s, size_t begin) {
  size_t end = s.size();
  while (end > begin) {
    size_t i = end - 1;  // back to the character's first byte
    while (i > begin && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    const Utf8Char c = DecodeUtf8At(s, i);
    if (c.cp == Utf8Char::kInvalid || i + c.len != end || !IsPythonSpace(c.cp)) break;
    end = i;
  }
  return end;
}

std::string_view StripChar(std::string_view s, char c, bool left, bool right) {
  while (left && !s.empty() && s.front() == c) s.remove_prefix(1);
  while (right && !s.empty() && s.back() == c) s.remove_suffix(1);
  return s;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// A rendered example: the template's control tokens, and the text between
// them with where its counted part starts (npos: none of it).
struct Piece {
  int32_t special = -1;
  bool counted = false;  // a control token the loss counts (an answer's end)
  std::string text;
  size_t mark = std::string::npos;
};

class Renderer {
 public:
  explicit Renderer(const BpeTokenizer& t) : t_(t) {}

  Status Special(std::string_view content, bool counted = false) {
    const std::optional<int32_t> id = t_.TokenId(content);
    if (!id.has_value()) {
      return Status::InvalidArgument("the tokenizer has no " + std::string(content) + " token, which the chat format needs");
    }
    pieces_.push_back({*id, counted, {}, std::string::npos});
    return Status::Ok();
  }
  void SpecialId(int32_t id, bool counted = false) { pieces_.push_back({id, counted, {}, std::string::npos}); }
  void Text(std::string text, size_t mark = std::string::npos) {
    pieces_.push_back({-1, false, std::move(text), mark});
  }

  TokenizedExample Tokenize(int64_t line) const {
    TokenizedExample e;
    e.line = line;
    for (const Piece& p : pieces_) {
      if (p.special >= 0) {
        e.ids.push_back(p.special);
        e.counted.push_back(p.counted ? 1 : 0);
        continue;
      }
      const size_t before = e.ids.size();
      const size_t mark = p.mark == std::string::npos ? std::string::npos : t_.EncodeMarked(p.text, p.mark, e.ids);
      if (p.mark == std::string::npos) t_.Encode(p.text, e.ids);
      for (size_t i = before; i < e.ids.size(); ++i) e.counted.push_back(mark != std::string::npos && i >= mark ? 1 : 0);
    }
    return e;
  }

 private:
  const BpeTokenizer& t_;
  std::vector<Piece> pieces_;
};

Status Llama3Turn(Renderer& r, Role role, std::string_view content) {
  const bool answer = role == Role::kAssistant;
  PSTAR_RETURN_IF_ERROR(r.Special("<|start_header_id|>"));
  r.Text(RoleName(role));
  PSTAR_RETURN_IF_ERROR(r.Special("<|end_header_id|>"));
  r.Text("\n\n" + std::string(StripPythonWhitespace(content)), answer ? 2 : std::string::npos);
  return r.Special("<|eot_id|>", answer);
}

Status RenderLlama3(const ChatExample& ex, Renderer& r) {
  PSTAR_RETURN_IF_ERROR(r.Special("<|begin_of_text|>"));
  for (const ChatMessage& m : ex.messages) PSTAR_RETURN_IF_ERROR(Llama3Turn(r, m.role, m.content));
  return Status::Ok();
}

// Llama 3.1 to 3.3 Instruct's template without tools: a system block always
// (the knowledge cutoff, the date, then the first message's text when it is
// a system message, stripped), then every other message as Llama 3's.
Status RenderLlama31(const ChatExample& ex, Renderer& r, std::string_view date) {
  PSTAR_RETURN_IF_ERROR(r.Special("<|begin_of_text|>"));
  PSTAR_RETURN_IF_ERROR(r.Special("<|start_header_id|>"));
  r.Text("system");
  PSTAR_RETURN_IF_ERROR(r.Special("<|end_header_id|>"));
  const bool system_first = ex.messages[0].role == Role::kSystem;
  const std::string_view system = system_first ? StripPythonWhitespace(ex.messages[0].content) : std::string_view();
  r.Text("\n\nCutting Knowledge Date: December 2023\nToday Date: " + std::string(date) + "\n\n" + std::string(system));
  PSTAR_RETURN_IF_ERROR(r.Special("<|eot_id|>"));
  for (size_t i = system_first ? 1 : 0; i < ex.messages.size(); ++i) {
    PSTAR_RETURN_IF_ERROR(Llama3Turn(r, ex.messages[i].role, ex.messages[i].content));
  }
  return Status::Ok();
}

Status ChatmlTurn(Renderer& r, std::string_view role, std::string body, bool answer) {
  PSTAR_RETURN_IF_ERROR(r.Special("<|im_start|>"));
  const size_t mark = answer ? role.size() + 1 : std::string::npos;
  r.Text(std::string(role) + "\n" + body, mark);
  PSTAR_RETURN_IF_ERROR(r.Special("<|im_end|>", answer));
  r.Text("\n");
  return Status::Ok();
}

Status RenderChatml(const ChatExample& ex, Renderer& r) {
  for (const ChatMessage& m : ex.messages) {
    PSTAR_RETURN_IF_ERROR(ChatmlTurn(r, RoleName(m.role), m.content, m.role == Role::kAssistant));
  }
  return Status::Ok();
}

// Qwen2.5 Instruct's template without tools: ChatML, after its default
// system message where the first message is not a system message.
Status RenderQwen25(const ChatExample& ex, Renderer& r) {
  if (ex.messages[0].role != Role::kSystem) {
    PSTAR_RETURN_IF_ERROR(
        ChatmlTurn(r, "system", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", false));
  }
  return RenderChatml(ex, r);
}

// Qwen3's template without tools: a leading system message, the questions,
// and each answer, those after the last question with their <think> block
// (empty unless the answer holds one), earlier ones without it.
Status RenderQwen3(const ChatExample& ex, Renderer& r) {
  const std::vector<ChatMessage>& ms = ex.messages;
  size_t last_query = ms.size() - 1;
  for (size_t k = ms.size(); k-- > 0;) {
    const std::string_view c = ms[k].content;
    if (ms[k].role == Role::kUser && !(StartsWith(c, "<tool_response>") && EndsWith(c, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < ms.size(); ++i) {
    const ChatMessage& m = ms[i];
    if (m.role != Role::kAssistant) {
      PSTAR_RETURN_IF_ERROR(ChatmlTurn(r, RoleName(m.role), m.content, false));
      continue;
    }
    std::string_view content = m.content, reasoning;
    const size_t close = content.find("</think>");
    if (close != std::string_view::npos) {
      const std::string_view before = StripChar(content.substr(0, close), '\n', false, true);
      const size_t open = before.rfind("<think>");
      reasoning = StripChar(open == std::string_view::npos ? before : before.substr(open + 7), '\n', true, false);
      content = StripChar(content.substr(content.rfind("</think>") + 8), '\n', true, false);
    }
    std::string body;
    if (i > last_query && (i + 1 == ms.size() || !reasoning.empty())) {
      body = "<think>\n" + std::string(StripChar(reasoning, '\n', true, true)) + "\n</think>\n\n" +
             std::string(StripChar(content, '\n', true, false));
    } else {
      body = std::string(content);
    }
    PSTAR_RETURN_IF_ERROR(ChatmlTurn(r, "assistant", std::move(body), true));
  }
  return Status::Ok();
}

Status RenderPlain(const ChatExample& ex, const BpeTokenizer& t, Renderer& r) {
  if (!ex.completion) {
    return Status::InvalidArgument("data.chat_format none takes prompt/completion lines, not messages");
  }
  if (t.eot() < 0) return Status::InvalidArgument("the tokenizer has no end-of-text token to end a completion with");
  for (int32_t id : t.DocumentStart()) r.SpecialId(id);
  const std::string& prompt = ex.messages[0].content;
  r.Text(prompt + ex.messages[1].content, prompt.size());
  r.SpecialId(t.eot(), /*counted=*/true);
  return Status::Ok();
}

}  // namespace

std::string_view StripPythonWhitespace(std::string_view s) {
  const size_t begin = SkipSpaceForward(s);
  return s.substr(begin, SkipSpaceBackward(s, begin) - begin);
}

const char* ChatFormatName(ChatFormat f) {
  switch (f) {
    case ChatFormat::kNone: return "none";
    case ChatFormat::kLlama3: return "llama3";
    case ChatFormat::kLlama31: return "llama3.1";
    case ChatFormat::kChatml: return "chatml";
    case ChatFormat::kQwen25: return "qwen2.5";
    case ChatFormat::kQwen3: return "qwen3";
  }
  return "none";
}

Result<ChatFormat> ParseChatFormat(std::string_view name) {
  for (ChatFormat f : {ChatFormat::kNone, ChatFormat::kLlama3, ChatFormat::kLlama31, ChatFormat::kChatml,
                       ChatFormat::kQwen25, ChatFormat::kQwen3}) {
    if (name == ChatFormatName(f)) return f;
  }
  return Status::InvalidArgument(
      "data.chat_format must be auto, llama3, llama3.1, chatml, qwen2.5, qwen3 or none, not '" + std::string(name) +
      "'");
}

ChatFormat ChatFormatFor(const BpeTokenizer& t) {
  const auto has = [&](std::string_view s) { return t.TokenId(s).has_value(); };
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>")) return ChatFormat::kLlama3;
  if (has("<|im_start|>") && has("<|im_end|>")) {
    return has("<think>") && has("</think>") ? ChatFormat::kQwen3 : ChatFormat::kChatml;
  }
  return ChatFormat::kNone;
}

Result<std::vector<ChatExample>> ParseJsonlExamples(std::string_view text, const std::string& source) {
  std::vector<ChatExample> out;
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    const std::string at = source + " line " + std::to_string(line_no) + ": ";
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > kMaxExampleLineBytes) {
      return Status::InvalidArgument(at + std::to_string(line.size()) + " bytes, over the " +
                                     std::to_string(kMaxExampleLineBytes >> 20) + " MiB an example line may hold");
    }
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    if (!IsValidUtf8(line)) return Status::InvalidArgument(at + "not valid UTF-8");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      const std::string what = e.what();
      if (what.find("surrogate") != std::string::npos) {
        return Status::InvalidArgument(at + "an unpaired UTF-16 surrogate escape near byte " + std::to_string(e.byte));
      }
      return Status::InvalidArgument(at + "not a JSON object (a syntax error at byte " + std::to_string(e.byte) +
                                     (e.byte >= line.size() ? ": the line ends early)" : ")"));
    } catch (const nlohmann::json::out_of_range&) {
      return Status::InvalidArgument(at + "not a JSON object pstar reads (a number too large for a double)");
    } catch (const nlohmann::json::exception& e) {
      return Status::InvalidArgument(at + "not a JSON object pstar reads (" + std::string(e.what()) + ")");
    }
    if (!j.is_object()) return Status::InvalidArgument(at + "not a JSON object");
    const bool chat = j.contains("messages"), pc = j.contains("prompt") || j.contains("completion");
    if (chat == pc) {
      return Status::InvalidArgument(at + (chat ? "has both \"messages\" and \"prompt\"/\"completion\""
                                                : "has neither \"messages\" nor \"prompt\" and \"completion\""));
    }
    ChatExample ex;
    ex.line = line_no;
    if (pc) {
      for (const char* key : {"prompt", "completion"}) {
        if (!j.contains(key) || !j[key].is_string()) {
          return Status::InvalidArgument(at + "\"" + key + "\" must be a string");
        }
      }
      ex.completion = true;
      ex.messages.push_back({Role::kUser, j["prompt"].get<std::string>()});
      ex.messages.push_back({Role::kAssistant, j["completion"].get<std::string>()});
      if (ex.messages[1].content.empty()) return Status::InvalidArgument(at + "an empty completion");
    } else {
      const nlohmann::json& ms = j["messages"];
      if (!ms.is_array() || ms.empty()) return Status::InvalidArgument(at + "\"messages\" must be a non-empty array");
      bool answered = false;
      for (size_t k = 0; k < ms.size(); ++k) {
        const std::string which = "message " + std::to_string(k + 1);
        const nlohmann::json& m = ms[k];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
            !m["content"].is_string()) {
          return Status::InvalidArgument(at + which + " must be an object with string \"role\" and \"content\"");
        }
        const std::string role = m["role"].get<std::string>();
        ChatMessage msg;
        if (role == "system") {
          msg.role = Role::kSystem;
        } else if (role == "user") {
          msg.role = Role::kUser;
        } else if (role == "assistant") {
          msg.role = Role::kAssistant;
        } else {
          return Status::InvalidArgument(at + which + " has role \"" + role + "\" (system, user or assistant)");
        }
        msg.content = m["content"].get<std::string>();
        if (msg.role == Role::kAssistant) {
          if (msg.content.empty()) return Status::InvalidArgument(at + which + " is an empty answer");
          answered = true;
        }
        ex.messages.push_back(std::move(msg));
      }
      if (!answered) return Status::InvalidArgument(at + "no assistant message: nothing to learn from");
    }
    out.push_back(std::move(ex));
  }
  if (out.empty()) return Status::InvalidArgument(source + ": no examples");
  return out;
}

Result<TokenizedExample> TokenizeExample(const ChatExample& ex, ChatFormat format, const BpeTokenizer& t,
                                         std::string_view date) {
  Renderer r(t);
  Status s;
  switch (format) {
    case ChatFormat::kNone: s = RenderPlain(ex, t, r); break;
    case ChatFormat::kLlama3: s = RenderLlama3(ex, r); break;
    case ChatFormat::kLlama31: s = RenderLlama31(ex, r, date); break;
    case ChatFormat::kChatml: s = RenderChatml(ex, r); break;
    case ChatFormat::kQwen25: s = RenderQwen25(ex, r); break;
    case ChatFormat::kQwen3: s = RenderQwen3(ex, r); break;
  }
  if (!s.ok()) return s;
  return r.Tokenize(ex.line);
}

}  // namespace pstar
