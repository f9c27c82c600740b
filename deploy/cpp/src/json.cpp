#include "json.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace jit2triton::json {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Value document() {
    Value v = value();
    skip_space();
    if (pos_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error(std::string("invalid JSON at byte ") + std::to_string(pos_) + ": " + what);
  }

  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }

  char peek() {
    skip_space();
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }

  void expect(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("unexpected token");
    pos_ += word.size();
  }

  // Deeper nesting than any manifest has is refused before it can exhaust the stack (a hand-made "[[[[...").
  static constexpr int kMaxDepth = 256;
  int depth_ = 0;

  Value value() {
    Value v;
    switch (peek()) {
      case '{':
      case '[':
        if (++depth_ > kMaxDepth) fail("nested too deeply");
        if (s_[pos_] == '{') object(v); else array(v);
        --depth_;
        break;
      case '"': v.kind = Value::Kind::String; v.text = string(); break;
      case 't': expect("true"); v.kind = Value::Kind::Bool; v.boolean = true; break;
      case 'f': expect("false"); v.kind = Value::Kind::Bool; break;
      case 'n': expect("null"); break;
      // Python's json writes non-finite floats as bare words; the package tags them, but accept them anyway.
      case 'N': expect("NaN"); v.kind = Value::Kind::Float; v.number = NAN; break;
      case 'I': expect("Infinity"); v.kind = Value::Kind::Float; v.number = INFINITY; break;
      default: number(v);
    }
    return v;
  }

  void object(Value& v) {
    v.kind = Value::Kind::Object;
    ++pos_;
    if (peek() == '}') { ++pos_; return; }
    while (true) {
      if (peek() != '"') fail("expected a key");
      std::string key = string();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      v.members.emplace_back(std::move(key), value());
      char c = peek();
      ++pos_;
      if (c == '}') return;
      if (c != ',') fail("expected ',' or '}'");
    }
  }

  void array(Value& v) {
    v.kind = Value::Kind::Array;
    ++pos_;
    if (peek() == ']') { ++pos_; return; }
    while (true) {
      v.items.push_back(value());
      char c = peek();
      ++pos_;
      if (c == ']') return;
      if (c != ',') fail("expected ',' or ']'");
    }
  }

  void number(Value& v) {
    size_t start = pos_;
    bool is_float = false;
    if (pos_ < s_.size() && s_[pos_] == '-') {
      ++pos_;
      if (s_.substr(pos_, 8) == "Infinity") { pos_ += 8; v.kind = Value::Kind::Float; v.number = -INFINITY; return; }
    }
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') is_float = true;
      else if (c < '0' || c > '9') break;
      ++pos_;
    }
    std::string digits(s_.substr(start, pos_ - start));
    if (digits.empty() || digits == "-") fail("expected a value");
    char* end = nullptr;
    if (is_float) {
      v.kind = Value::Kind::Float;
      v.number = std::strtod(digits.c_str(), &end);
    } else {
      v.kind = Value::Kind::Int;
      errno = 0;
      v.integer = std::strtoll(digits.c_str(), &end, 10);
      if (errno == ERANGE) fail("integer out of range");
      v.number = static_cast<double>(v.integer);
    }
    if (end != digits.c_str() + digits.size()) fail("malformed number");
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("short \\u escape");
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= c - '0';
      else if (c >= 'a' && c <= 'f') cp |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') cp |= c - 'A' + 10;
      else fail("bad \\u escape");
    }
    return cp;
  }

  std::string string() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (c != '\\') { out += c; continue; }
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {  // a surrogate pair
            pos_ += 2;
            uint32_t low = hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
};

[[noreturn]] void wrong(const char* wanted) { throw std::runtime_error(std::string("manifest: expected ") + wanted); }

}  // namespace

const Value* Value::find(std::string_view key) const {
  for (const auto& [name, v] : members)
    if (name == key) return &v;
  return nullptr;
}

const Value* Value::optional(std::string_view key) const {
  const Value* v = find(key);
  return v && !v->is_null() ? v : nullptr;
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw std::runtime_error("manifest: missing field '" + std::string(key) + "'");
  return *v;
}

const Value& Value::operator[](size_t i) const {
  if (kind != Kind::Array || i >= items.size()) wrong("an array with more items");
  return items[i];
}

int64_t Value::as_int() const {
  if (kind == Kind::Int) return integer;
  if (kind == Kind::Bool) return boolean;
  wrong("an integer");
}

double Value::as_double() const {
  if (kind == Kind::Float || kind == Kind::Int) return number;
  wrong("a number");
}

bool Value::as_bool() const {
  if (kind == Kind::Bool) return boolean;
  wrong("a boolean");
}

const std::string& Value::as_string() const {
  if (kind == Kind::String) return text;
  wrong("a string");
}

Value parse(std::string_view text) { return Parser(text).document(); }

bool equal(const Value& a, const Value& b) {
  if (a.kind != b.kind || a.boolean != b.boolean || a.integer != b.integer || a.text != b.text ||
      a.items.size() != b.items.size() || a.members.size() != b.members.size())
    return false;
  if (a.kind == Value::Kind::Float && !(a.number == b.number)) return false;
  for (size_t i = 0; i < a.items.size(); ++i)
    if (!equal(a.items[i], b.items[i])) return false;
  for (size_t i = 0; i < a.members.size(); ++i)
    if (a.members[i].first != b.members[i].first || !equal(a.members[i].second, b.members[i].second)) return false;
  return true;
}

}  // namespace jit2triton::json
