// The Jinja subset chat templates are written in, and the ChatML check on top of it (chat_template.h).
#include "generate/chat_template.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/error.h"

namespace loom::generate {

namespace {

// What a template is cut into: literal text, {{ expression }}, {% statement %}.
struct Piece {
  enum Kind { kText, kOutput, kStatement } kind;
  std::string text;  // the literal, or the tag's inside without delimiters and trim marks
};

[[noreturn]] void unsupported(const std::string& what) {
  throw Error("chat template: " + what + " is outside the Jinja subset loom renders (ChatML templates)");
}

// Hugging Face compiles chat templates with trim_blocks and lstrip_blocks: the newline after a {% %} tag
// is dropped, and so are spaces and tabs between a line's start and a {% %} tag. "-" marks trim all
// whitespace on their side.
std::vector<Piece> cut(const std::string& s) {
  std::vector<Piece> out;
  size_t pos = 0;
  bool trim_next = false, after_block = false;
  while (pos < s.size()) {
    size_t open = s.find('{', pos);
    while (open != std::string::npos && open + 1 < s.size() && !std::strchr("{%#", s[open + 1])) open = s.find('{', open + 1);
    if (open + 1 >= s.size()) open = std::string::npos;
    std::string text = s.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (trim_next) {
      size_t k = 0;
      while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
      text.erase(0, k);
    } else if (after_block && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Piece::kText, text});
      break;
    }
    const char kind = s[open + 1];
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = s.find(close, open + 2);
    if (end == std::string::npos) unsupported(std::string("an unclosed '{") + kind + "'");
    std::string inner = s.substr(open + 2, end - open - 2);
    const bool trim_before = !inner.empty() && inner.front() == '-';
    const bool trim_after = !inner.empty() && inner.back() == '-';
    if (trim_before || (!inner.empty() && inner.front() == '+')) inner.erase(0, 1);
    if (trim_after || (!inner.empty() && inner.back() == '+')) inner.pop_back();
    if (trim_before) {
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    } else if (kind == '%') {  // lstrip_blocks: only blanks back to the start of the line
      size_t j = open;
      while (j > pos && (s[j - 1] == ' ' || s[j - 1] == '\t')) --j;
      if (j == 0 || s[j - 1] == '\n') text.erase(text.size() - std::min(text.size(), open - j));
    }
    if (!text.empty()) out.push_back({Piece::kText, text});
    if (kind != '#') out.push_back({kind == '{' ? Piece::kOutput : Piece::kStatement, inner});
    trim_next = trim_after;
    after_block = kind != '{';
    pos = end + 2;
  }
  return out;
}

// Expression tokens.
struct Tok {
  enum Kind { kString, kName, kInt, kOp, kEnd } kind;
  std::string text;
};

std::vector<Tok> lex(const std::string& e) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < e.size()) {
    const char c = e[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < e.size() && e[j] != c; ++j) {
        if (e[j] == '\\' && j + 1 < e.size()) {
          const char x = e[++j];
          v += x == 'n' ? '\n' : x == 't' ? '\t' : x;
        } else {
          v += e[j];
        }
      }
      if (j >= e.size()) unsupported("an unterminated string in '" + e + "'");
      out.push_back({Tok::kString, v});
      i = j + 1;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < e.size() && (std::isalnum(static_cast<unsigned char>(e[j])) || e[j] == '_')) ++j;
      out.push_back({Tok::kName, e.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < e.size() && std::isdigit(static_cast<unsigned char>(e[j]))) ++j;
      out.push_back({Tok::kInt, e.substr(i, j - i)});
      i = j;
    } else if (e.compare(i, 2, "==") == 0 || e.compare(i, 2, "!=") == 0) {
      out.push_back({Tok::kOp, e.substr(i, 2)});
      i += 2;
    } else if (std::strchr("[]().+", c)) {
      out.push_back({Tok::kOp, std::string(1, c)});
      ++i;
    } else {
      unsupported(std::string("the operator '") + c + "' in '" + e + "'");
    }
  }
  out.push_back({Tok::kEnd, ""});
  return out;
}

struct Value {
  enum Kind { kString, kBool, kInt, kMessage, kMessages, kLoop } kind = kBool;
  std::string s;
  int64_t i = 0;
  bool b = false;
  const ChatMessage* message = nullptr;
  bool truthy() const { return kind == kString ? !s.empty() : kind == kInt ? i != 0 : kind == kBool ? b : true; }
};

struct Scope {
  const std::vector<ChatMessage>* messages;
  bool add_generation_prompt;
  const ChatMessage* message = nullptr;  // inside the loop
  size_t index = 0;
};

// A recursive-descent evaluator: or > and > not > (==, !=) > + > postfix ([...], .name) > atom.
class Eval {
 public:
  Eval(const std::string& expr, const Scope& scope) : expr_(expr), toks_(lex(expr)), scope_(scope) {}
  Value run() {
    Value v = disjunction();
    if (toks_[at_].kind != Tok::kEnd) unsupported("'" + toks_[at_].text + "' in '" + expr_ + "'");
    return v;
  }

 private:
  bool accept_name(const char* name) {
    if (toks_[at_].kind == Tok::kName && toks_[at_].text == name) return ++at_, true;
    return false;
  }
  bool accept_op(const char* op) {
    if (toks_[at_].kind == Tok::kOp && toks_[at_].text == op) return ++at_, true;
    return false;
  }
  Value boolean(bool b) { Value v; v.b = b; return v; }
  Value disjunction() {
    Value v = conjunction();
    while (accept_name("or")) { Value r = conjunction(); v = boolean(v.truthy() || r.truthy()); }
    return v;
  }
  Value conjunction() {
    Value v = negation();
    while (accept_name("and")) { Value r = negation(); v = boolean(v.truthy() && r.truthy()); }
    return v;
  }
  Value negation() {
    if (accept_name("not")) return boolean(!negation().truthy());
    Value v = sum();
    for (const char* op : {"==", "!="}) {
      if (accept_op(op)) {
        Value r = sum();
        const bool eq = v.kind == r.kind && v.s == r.s && v.i == r.i && v.b == r.b && v.message == r.message;
        return boolean(op[0] == '=' ? eq : !eq);
      }
    }
    return v;
  }
  Value sum() {
    Value v = postfix();
    while (accept_op("+")) {
      Value r = postfix();
      if (v.kind != Value::kString || r.kind != Value::kString) unsupported("'+' on a non-string in '" + expr_ + "'");
      v.s += r.s;
    }
    return v;
  }
  Value postfix() {
    Value v = atom();
    while (true) {
      std::string key;
      Value index;
      if (accept_op("[")) {
        index = disjunction();
        if (!accept_op("]")) unsupported("a subscript without ']' in '" + expr_ + "'");
        if (index.kind == Value::kString) key = index.s;
      } else if (accept_op(".")) {
        if (toks_[at_].kind != Tok::kName) unsupported("'.' without a name in '" + expr_ + "'");
        key = toks_[at_++].text;
      } else {
        return v;
      }
      if (v.kind == Value::kMessages && index.kind == Value::kInt) {
        const auto& m = *scope_.messages;
        int64_t k = index.i < 0 ? index.i + static_cast<int64_t>(m.size()) : index.i;
        if (k < 0 || k >= static_cast<int64_t>(m.size())) unsupported("messages[" + std::to_string(index.i) + "] out of range");
        v = Value{};
        v.kind = Value::kMessage;
        v.message = &m[static_cast<size_t>(k)];
      } else if (v.kind == Value::kMessage && (key == "role" || key == "content")) {
        std::string s = key == "role" ? v.message->role : v.message->content;
        v = Value{};
        v.kind = Value::kString;
        v.s = std::move(s);
      } else if (v.kind == Value::kLoop && (key == "first" || key == "last" || key == "index0" || key == "index")) {
        const size_t n = scope_.messages->size(), k = scope_.index;
        if (key == "first" || key == "last") {
          v = boolean(key == "first" ? k == 0 : k + 1 == n);
        } else {
          v = Value{};
          v.kind = Value::kInt;
          v.i = static_cast<int64_t>(k) + (key == "index" ? 1 : 0);
        }
      } else {
        unsupported("the subscript '" + (key.empty() ? "[...]" : key) + "' in '" + expr_ + "'");
      }
    }
  }
  Value atom() {
    const Tok t = toks_[at_++];
    Value v;
    if (t.kind == Tok::kString) {
      v.kind = Value::kString;
      v.s = t.text;
    } else if (t.kind == Tok::kInt) {
      v.kind = Value::kInt;
      v.i = std::stoll(t.text);
    } else if (t.kind == Tok::kOp && t.text == "(") {
      v = disjunction();
      if (!accept_op(")")) unsupported("'(' without ')' in '" + expr_ + "'");
    } else if (t.kind == Tok::kName && (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False")) {
      v = boolean(t.text[0] == 't' || t.text[0] == 'T');
    } else if (t.kind == Tok::kName && t.text == "messages") {
      v.kind = Value::kMessages;
    } else if (t.kind == Tok::kName && t.text == "add_generation_prompt") {
      v = boolean(scope_.add_generation_prompt);
    } else if (t.kind == Tok::kName && t.text == "message" && scope_.message) {
      v.kind = Value::kMessage;
      v.message = scope_.message;
    } else if (t.kind == Tok::kName && t.text == "loop" && scope_.message) {
      v.kind = Value::kLoop;
    } else {
      unsupported("'" + t.text + "' in '" + expr_ + "'");
    }
    return v;
  }

  const std::string& expr_;
  std::vector<Tok> toks_;
  size_t at_ = 0;
  const Scope& scope_;
};

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

bool starts_with_word(const std::string& s, const char* word) {
  const size_t n = std::strlen(word);
  return s.compare(0, n, word) == 0 && (s.size() == n || std::isspace(static_cast<unsigned char>(s[n])));
}

// Renders pieces [begin, end) and returns where it stopped: at `end`, or at an elif/else/endif/endfor
// statement (which the caller handles).
class Renderer {
 public:
  Renderer(const std::vector<Piece>& pieces, Scope scope) : p_(pieces), scope_(scope) {}
  std::string render() {
    std::string out;
    size_t i = block(0, out, true);
    if (i != p_.size()) unsupported("'{% " + trim(p_[i].text) + " %}' without its opening statement");
    return out;
  }

 private:
  // Renders from i while `emit`; returns the index of the closing statement (or p_.size()).
  size_t block(size_t i, std::string& out, bool emit) {
    while (i < p_.size()) {
      const Piece& p = p_[i];
      if (p.kind == Piece::kText) {
        if (emit) out += p.text;
        ++i;
      } else if (p.kind == Piece::kOutput) {
        if (emit) {
          Value v = Eval(p.text, scope_).run();
          if (v.kind != Value::kString) unsupported("'{{ " + trim(p.text) + " }}' (not a string)");
          out += v.s;
        }
        ++i;
      } else {
        const std::string st = trim(p.text);
        if (st == "endif" || st == "endfor" || st == "else" || starts_with_word(st, "elif")) return i;
        if (starts_with_word(st, "if")) {
          i = if_statement(i, out, emit);
        } else if (st == "for message in messages") {
          i = for_statement(i, out, emit);
        } else {
          unsupported("'{% " + st + " %}'");
        }
      }
    }
    return i;
  }
  size_t if_statement(size_t i, std::string& out, bool emit) {
    bool done = false;  // a branch was taken
    std::string cond = trim(p_[i].text).substr(2);
    while (true) {
      const bool take = emit && !done && (cond.empty() || Eval(cond, scope_).run().truthy());
      i = block(i + 1, out, take);
      done = done || take;
      if (i == p_.size()) unsupported("'{% if %}' without '{% endif %}'");
      const std::string st = trim(p_[i].text);
      if (st == "endif") return i + 1;
      if (st == "else") {
        cond.clear();
      } else if (starts_with_word(st, "elif")) {
        cond = st.substr(4);
      } else {
        unsupported("'{% " + st + " %}' inside '{% if %}'");
      }
    }
  }
  size_t for_statement(size_t i, std::string& out, bool emit) {
    if (scope_.message) unsupported("a nested '{% for %}'");
    size_t end = i;
    const size_t n = emit ? scope_.messages->size() : 0;
    Scope outer = scope_;
    // The body is walked once even for no messages, to find where it ends.
    for (size_t k = 0; k < std::max<size_t>(n, 1); ++k) {
      scope_.message = n ? &(*scope_.messages)[k] : nullptr;
      scope_.index = k;
      end = block(i + 1, out, n > 0);
    }
    scope_ = outer;
    if (end == p_.size() || trim(p_[end].text) != "endfor") unsupported("'{% for %}' without '{% endfor %}'");
    return end + 1;
  }

  const std::vector<Piece>& p_;
  Scope scope_;
};

std::string block_of(const std::string& role, const std::string& content) {
  return std::string(kChatMlStart) + role + "\n" + content + kChatMlEnd + "\n";
}

std::string excerpt(const std::string& s) {
  std::string e = s.substr(0, 80);
  for (auto& c : e) if (c == '\n') c = ' ';
  return "'" + e + (s.size() > 80 ? "...'" : "'");
}

}  // namespace

std::string render_chat_template(const std::string& jinja, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  const std::vector<Piece> pieces = cut(jinja);
  return Renderer(pieces, Scope{&messages, add_generation_prompt}).render();
}

ChatTemplate ChatTemplate::from_jinja(const std::string& jinja) {
  LOOM_CHECK(!jinja.empty(), "chat: the model has no chat template (GGUF tokenizer.chat_template / "
                             "tokenizer_config.json chat_template); loom chat needs a ChatML one");
  const std::string refuse = "chat: cannot use the model's chat template " + excerpt(jinja) + ": ";
  auto render = [&](const std::vector<ChatMessage>& m, bool gen) {
    try {
      return render_chat_template(jinja, m, gen);
    } catch (const Error& e) {
      throw Error(refuse + e.what());
    }
  };
  // Probe strings that occur in no template, so they cannot be confused with its own text.
  const std::string sys = "S1-probe", u1 = "U1-probe", a1 = "A1-probe", u2 = "U2-probe";
  const std::string user_only = render({{"user", u1}}, true);
  const std::string tail = block_of("user", u1) + kChatMlStart + "assistant\n";
  LOOM_CHECK(user_only.size() >= tail.size() && user_only.compare(user_only.size() - tail.size(), tail.size(), tail) == 0,
             refuse, "it is not ChatML: a user message renders as ", excerpt(user_only), ", expected it to end with ",
             excerpt(tail));
  ChatTemplate t;
  const std::string prefix = user_only.substr(0, user_only.size() - tail.size());
  if (!prefix.empty()) {
    const std::string head = std::string(kChatMlStart) + "system\n", foot = std::string(kChatMlEnd) + "\n";
    const bool ok = prefix.size() >= head.size() + foot.size() && prefix.compare(0, head.size(), head) == 0 &&
                    prefix.compare(prefix.size() - foot.size(), foot.size(), foot) == 0;
    LOOM_CHECK(ok, refuse, "it puts ", excerpt(prefix), " before the first message, which is not a ChatML system block");
    t.default_system = prefix.substr(head.size(), prefix.size() - head.size() - foot.size());
    LOOM_CHECK(t.default_system->find(kChatMlStart) == std::string::npos && t.default_system->find(kChatMlEnd) == std::string::npos,
               refuse, "its default system message holds a control token");
  }
  // A system message replaces the default one; later turns follow the same pattern; without
  // add_generation_prompt there is no assistant prefix.
  struct Probe {
    std::vector<ChatMessage> messages;
    bool gen;
    std::string expected;
  };
  const std::string pre = prefix;
  const std::vector<Probe> probes = {
      {{{"system", sys}, {"user", u1}}, true, block_of("system", sys) + block_of("user", u1) + kChatMlStart + "assistant\n"},
      {{{"user", u1}, {"assistant", a1}, {"user", u2}},
       true,
       pre + block_of("user", u1) + block_of("assistant", a1) + block_of("user", u2) + kChatMlStart + "assistant\n"},
      {{{"user", u1}}, false, pre + block_of("user", u1)},
  };
  for (const auto& p : probes) {
    const std::string got = render(p.messages, p.gen);
    LOOM_CHECK(got == p.expected, refuse, "it is not ChatML: a probe conversation renders as ", excerpt(got),
               ", ChatML gives ", excerpt(p.expected));
  }
  return t;
}

}  // namespace loom::generate
