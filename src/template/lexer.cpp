// The tokenizer. Mirrors jinja2.lexer with transformers' environment: trim_blocks (drop the first
// newline after a block or comment tag), lstrip_blocks (drop spaces and tabs before a block or
// comment tag that starts its line), keep_trailing_newline=False, and the explicit controls
// `{%-` / `-%}` (strip all whitespace on that side) and `{%+` / `+%}` (disable lstrip / trim).
#include <algorithm>
#include <cctype>

#include "template/ast.h"

namespace longctx::jinja {

void syntax_error(int line, int column, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "chat template syntax error at line " +
                                               std::to_string(line) + ", column " +
                                               std::to_string(column) + ": " + message);
}

namespace {

bool is_ws(char c) {  // ASCII part of Python's str.isspace()
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
         (c >= 0x1C && c <= 0x1F);
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) {
    // Jinja reads every newline style as "\n" and drops one trailing newline.
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t p = next_tag(pos);
      if (p == std::string::npos) {
        emit(Tok::kData, src_.substr(pos), pos);
        break;
      }
      char kind = src_[p + 1];
      size_t body = p + 2;
      char sign = 0;
      if (body < src_.size() && (src_[body] == '-' || src_[body] == '+')) sign = src_[body++];
      std::string text = src_.substr(pos, p - pos);
      strip_before_tag(text, sign, kind != '{', line_starting);
      if (!text.empty()) emit(Tok::kData, text, pos);
      if (kind == '#') {
        pos = lex_comment(p, body);
      } else if (kind == '%' && raw_begin(body) != std::string::npos) {
        pos = lex_raw(raw_begin(body));
      } else {
        pos = lex_tag(p, body, kind);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    auto [line, column] = where(src_.size());
    tokens_.push_back(Token{Tok::kEof, "", line, column});
    return std::move(tokens_);
  }

 private:
  std::pair<int, int> where(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  void emit(Tok type, std::string text, size_t offset) {
    auto [line, column] = where(offset);
    tokens_.push_back(Token{type, std::move(text), line, column});
  }

  bool starts(size_t i, std::string_view s) const { return src_.compare(i, s.size(), s) == 0; }

  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  // Whitespace control on the text before a tag (jinja2.lexer's OptionalLStrip).
  void strip_before_tag(std::string& text, char sign, bool is_block, bool line_starting) const {
    if (sign == '-') {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if (sign != '+' && is_block) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          std::all_of(text.begin() + l_pos, text.end(), is_ws))
        text.resize(l_pos);
    }
  }

  size_t skip_ws(size_t i) const {
    while (i < src_.size() && is_ws(src_[i])) ++i;
    return i;
  }

  // After a block or comment end tag: `-` strips all whitespace, `+` nothing, else trim_blocks
  // drops one newline.
  size_t after_block_end(size_t i, char sign) const {
    if (sign == '-') return skip_ws(i);
    if (sign != '+' && i < src_.size() && src_[i] == '\n') return i + 1;
    return i;
  }

  size_t lex_comment(size_t open, size_t body) {
    size_t q = src_.find("#}", body);
    if (q == std::string::npos) {
      auto [line, column] = where(open);
      syntax_error(line, column, "missing end of comment tag '#}'");
    }
    char sign = (q > body && (src_[q - 1] == '-' || src_[q - 1] == '+')) ? src_[q - 1] : 0;
    return after_block_end(q + 2, sign);
  }

  // `{% raw %}` (body points past `{%` and its sign): returns the offset after the tag, else npos.
  size_t raw_begin(size_t body) const {
    size_t i = skip_ws(body);
    if (!starts(i, "raw")) return std::string::npos;
    i = skip_ws(i + 3);
    if (starts(i, "-%}")) return skip_ws(i + 3);
    if (starts(i, "%}")) return i + 2;
    return std::string::npos;
  }

  size_t lex_raw(size_t content) {
    for (size_t q = src_.find("{%", content); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t i = q + 2;
      char sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
      i = skip_ws(i);
      if (!starts(i, "endraw")) continue;
      i = skip_ws(i + 6);
      char end_sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) end_sign = src_[i++];
      if (!starts(i, "%}")) continue;
      std::string text = src_.substr(content, q - content);
      strip_before_tag(text, sign, true, false);
      if (!text.empty()) emit(Tok::kData, text, content);
      return after_block_end(i + 2, end_sign);
    }
    auto [line, column] = where(content);
    syntax_error(line, column, "missing '{% endraw %}' for '{% raw %}'");
  }

  size_t lex_tag(size_t open, size_t i, char kind) {
    emit(kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "", open);
    const std::string_view end = kind == '%' ? "%}" : "}}";
    const Tok end_type = kind == '%' ? Tok::kBlockEnd : Tok::kVarEnd;
    int depth = 0;  // inside brackets `}}` is two braces, as in Jinja's balancing stack
    for (;;) {
      i = skip_ws(i);
      if (i >= src_.size()) {
        auto [line, column] = where(open);
        syntax_error(line, column,
                     "unexpected end of template: tag opened here was never closed with '" +
                         std::string(end) + "'");
      }
      if (depth == 0) {
        char sign = (src_[i] == '-' || src_[i] == '+') ? src_[i] : 0;
        if (sign && starts(i + 1, end) && (sign == '-' || kind == '%')) {
          emit(end_type, "", i);
          return kind == '%' ? after_block_end(i + 3, sign)
                             : (sign == '-' ? skip_ws(i + 3) : i + 3);
        }
        if (starts(i, end)) {
          emit(end_type, "", i);
          return kind == '%' ? after_block_end(i + 2, 0) : i + 2;
        }
      }
      char c = src_[i];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_'))
          ++j;
        emit(Tok::kName, src_.substr(i, j - i), i);
        i = j;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        i = lex_number(i);
      } else if (c == '\'' || c == '"') {
        i = lex_string(i);
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : kTwo)
          if (starts(i, t)) op = t;
        if (op.empty() &&
            std::string_view("+-*/%~()[]{},.:|=<>;").find(c) != std::string_view::npos)
          op = std::string(1, c);
        if (op.empty()) {
          auto [line, column] = where(i);
          syntax_error(line, column, std::string("unexpected character '") + c + "'");
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        emit(Tok::kOp, op, i);
        i += op.size();
      }
    }
  }

  size_t lex_number(size_t i) {
    size_t start = i;
    auto digits = [&](size_t j) {
      while (j < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[j])) ||
                                 (src_[j] == '_' && j + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[j + 1])))))
        ++j;
      return j;
    };
    i = digits(i);
    bool is_float = false;
    if (i + 1 < src_.size() && src_[i] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[i + 1]))) {
      i = digits(i + 1);
      is_float = true;
    }
    if (i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
      size_t j = i + 1;
      if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
      if (j < src_.size() && std::isdigit(static_cast<unsigned char>(src_[j]))) {
        i = digits(j);
        is_float = true;
      }
    }
    std::string text = src_.substr(start, i - start);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    emit(is_float ? Tok::kFloat : Tok::kInt, text, start);
    return i;
  }

  // Python string literal escapes (Jinja decodes with "unicode-escape"; other text is kept).
  size_t lex_string(size_t start) {
    char quote = src_[start];
    std::string out;
    size_t i = start + 1;
    auto hex = [&](size_t n) {
      if (i + n > src_.size()) return -1L;
      long v = 0;
      for (size_t k = 0; k < n; ++k) {
        char h = src_[i + k];
        if (!std::isxdigit(static_cast<unsigned char>(h))) return -1L;
        v = v * 16 +
            (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    while (i < src_.size() && src_[i] != quote) {
      if (src_[i] != '\\' || i + 1 >= src_.size()) {
        out += src_[i++];
        continue;
      }
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          long v = hex(n);
          if (v < 0) {
            auto [line, column] = where(i - 2);
            syntax_error(line, column, std::string("truncated \\") + e + " escape in string");
          }
          char32_t c = static_cast<char32_t>(v);
          out += utf8_encode(std::u32string_view(&c, 1));
          i += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = e - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k)
              v = v * 8 + (src_[i++] - '0');
            out += utf8_encode(std::u32string_view(&v, 1));
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    if (i >= src_.size()) {
      auto [line, column] = where(start);
      syntax_error(line, column, "unterminated string literal");
    }
    emit(Tok::kString, out, start);
    return i + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace longctx::jinja
