#include "structured/regex.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "longctx/core/error.h"

namespace longctx::structured {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10ffff;
constexpr int64_t kUnbounded = -1;
// Groups within groups: the parser and the compiler recurse once per level.
constexpr int kMaxNesting = 100;

// Code points as sorted, disjoint, non-adjacent closed ranges.
using CharSet = std::vector<std::pair<uint32_t, uint32_t>>;

CharSet normalized(CharSet s) {
  std::sort(s.begin(), s.end());
  CharSet out;
  for (const auto& r : s) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

CharSet complement(const CharSet& s) {
  CharSet out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : s) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

CharSet digit_set() { return {{'0', '9'}}; }
CharSet word_set() { return normalized({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); }
// ECMA-262 WhiteSpace and LineTerminator.
CharSet space_set() {
  return normalized({{'\t', '\r'},
                     {' ', ' '},
                     {0xa0, 0xa0},
                     {0x1680, 0x1680},
                     {0x2000, 0x200a},
                     {0x2028, 0x2029},
                     {0x202f, 0x202f},
                     {0x205f, 0x205f},
                     {0x3000, 0x3000},
                     {0xfeff, 0xfeff}});
}
CharSet dot_set() { return complement(normalized({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}})); }

struct Node {
  enum class Kind { kSet, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kConcat;
  CharSet set;
  std::vector<Node> kids;
  int64_t lo = 0, hi = 0;  // kRepeat; hi kUnbounded: no upper bound

  static Node of_set(CharSet s) {
    Node n;
    n.kind = Kind::kSet;
    n.set = std::move(s);
    return n;
  }
  static Node group(Kind k, std::vector<Node> kids) {
    Node n;
    n.kind = k;
    n.kids = std::move(kids);
    return n;
  }
};

bool nullable(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kSet:
      return false;
    case Node::Kind::kConcat:
      return std::all_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::Kind::kAlt:
      return std::any_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::Kind::kRepeat:
      return n.lo == 0 || nullable(n.kids[0]);
  }
  return false;
}

// The strings of n but the empty one (none: n matches only the empty string). A loop over a
// body that can be empty loops over this instead, so the grammar has no left recursion.
std::optional<Node> non_empty(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kSet:
      return n;
    case Node::Kind::kConcat: {
      std::vector<Node> alts;
      for (size_t i = 0; i < n.kids.size(); ++i) {
        if (auto first = non_empty(n.kids[i])) {
          std::vector<Node> seq{std::move(*first)};
          seq.insert(seq.end(), n.kids.begin() + static_cast<std::ptrdiff_t>(i) + 1, n.kids.end());
          alts.push_back(Node::group(Node::Kind::kConcat, std::move(seq)));
        }
        if (!nullable(n.kids[i])) break;
      }
      if (alts.empty()) return std::nullopt;
      return Node::group(Node::Kind::kAlt, std::move(alts));
    }
    case Node::Kind::kAlt: {
      std::vector<Node> alts;
      for (const Node& k : n.kids) {
        if (auto e = non_empty(k)) alts.push_back(std::move(*e));
      }
      if (alts.empty()) return std::nullopt;
      return Node::group(Node::Kind::kAlt, std::move(alts));
    }
    case Node::Kind::kRepeat: {
      if (n.hi == 0) return std::nullopt;
      auto first = non_empty(n.kids[0]);
      if (!first) return std::nullopt;
      Node rest = n;
      rest.lo = std::max<int64_t>(n.lo - 1, 0);
      rest.hi = n.hi == kUnbounded ? kUnbounded : n.hi - 1;
      return Node::group(Node::Kind::kConcat, {std::move(*first), std::move(rest)});
    }
  }
  return std::nullopt;
}

class Parser {
 public:
  Parser(std::string_view p, std::string context) : p_(p), context_(std::move(context)) {}

  struct Branch {
    Node node;
    bool start_anchor = false, end_anchor = false;
  };

  std::vector<Branch> parse_top() {
    std::vector<Branch> out;
    for (;;) {
      Branch b;
      if (peek('^')) {
        ++i_;
        b.start_anchor = true;
      }
      b.node = parse_sequence(0, &b.end_anchor);
      out.push_back(std::move(b));
      if (i_ >= p_.size()) break;
      LONGCTX_ASSERT(p_[i_] == '|', "regex parser stopped at '{}'", p_[i_]);
      ++i_;
    }
    return out;
  }

 private:
  [[noreturn]] void unsupported(const std::string& what, size_t at) const {
    LONGCTX_THROW(ErrorCode::kUnsupported, "{}: {} at offset {} is not supported", context_, what,
                  at);
  }
  [[noreturn]] void invalid(const std::string& what, size_t at) const {
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: {} at offset {}", context_, what, at);
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }

  Node parse_alternation(int depth) {
    std::vector<Node> alts{parse_sequence(depth, nullptr)};
    while (peek('|')) {
      ++i_;
      alts.push_back(parse_sequence(depth, nullptr));
    }
    if (alts.size() == 1) return std::move(alts[0]);
    return Node::group(Node::Kind::kAlt, std::move(alts));
  }

  // Items up to '|', ')' or the end. At the top level (end_anchor set) a '$' may close it.
  Node parse_sequence(int depth, bool* end_anchor) {
    std::vector<Node> items;
    while (i_ < p_.size() && !peek('|') && !peek(')')) {
      const size_t at = i_;
      const char c = p_[i_];
      if (c == '$') {
        ++i_;
        if (end_anchor != nullptr && (i_ == p_.size() || peek('|'))) {
          *end_anchor = true;
          break;
        }
        unsupported("the anchor '$' inside the pattern (only at the end)", at);
      }
      if (c == '^') unsupported("the anchor '^' inside the pattern (only at the start)", at);
      Node atom = parse_atom(depth);
      items.push_back(parse_quantifiers(std::move(atom)));
    }
    if (peek(')') && depth == 0) invalid("unmatched ')'", i_);
    if (items.size() == 1) return std::move(items[0]);
    return Node::group(Node::Kind::kConcat, std::move(items));
  }

  // The atom with its quantifier, if one follows.
  Node parse_quantifiers(Node atom) {
    const size_t at = i_;
    int64_t lo = 0, hi = 0;
    if (peek('*')) {
      lo = 0, hi = kUnbounded;
      ++i_;
    } else if (peek('+')) {
      lo = 1, hi = kUnbounded;
      ++i_;
    } else if (peek('?')) {
      lo = 0, hi = 1;
      ++i_;
    } else if (peek('{')) {
      ++i_;
      lo = parse_count(at);
      hi = lo;
      if (peek(',')) {
        ++i_;
        hi = peek('}') ? kUnbounded : parse_count(at);
      }
      if (!peek('}')) invalid("'{' that is not a quantifier {n}, {n,} or {n,m} (write \\{)", at);
      ++i_;
      if (hi != kUnbounded && hi < lo) invalid("a quantifier {n,m} with m < n", at);
    } else {
      return atom;
    }
    if (peek('?'))
      unsupported("a lazy quantifier ('" + std::string(p_.substr(at, i_ + 1 - at)) + "')", at);
    // ECMA-262 has no quantifier of a quantifier (a** a{2}{3}).
    if (peek('+') || peek('*') || peek('{')) invalid("nothing to repeat", i_);
    Node r;
    r.kind = Node::Kind::kRepeat;
    r.lo = lo;
    r.hi = hi;
    r.kids.push_back(std::move(atom));
    return r;
  }

  int64_t parse_count(size_t at) {
    if (i_ >= p_.size() || p_[i_] < '0' || p_[i_] > '9')
      invalid("'{' that is not a quantifier {n}, {n,} or {n,m} (write \\{)", at);
    int64_t v = 0;
    while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = std::min<int64_t>(v * 10 + (p_[i_] - '0'), kMaxRegexRepeat + 1);
      ++i_;
    }
    if (v > kMaxRegexRepeat)
      unsupported("a repetition count over " + std::to_string(kMaxRegexRepeat), at);
    return v;
  }

  Node parse_atom(int depth) {
    const size_t at = i_;
    const char c = p_[i_];
    switch (c) {
      case '(': {
        if (depth >= kMaxNesting) unsupported("nesting deeper than 100 groups", at);
        ++i_;
        if (peek('?')) {
          const std::string_view rest = p_.substr(i_);
          if (rest.rfind("?:", 0) == 0) {
            i_ += 2;
          } else if (rest.rfind("?=", 0) == 0 || rest.rfind("?!", 0) == 0) {
            unsupported("lookahead '(" + std::string(rest.substr(0, 2)) + "'", at);
          } else if (rest.rfind("?<=", 0) == 0 || rest.rfind("?<!", 0) == 0) {
            unsupported("lookbehind '(" + std::string(rest.substr(0, 3)) + "'", at);
          } else if (rest.rfind("?<", 0) == 0) {
            const size_t close = p_.find('>', i_);
            if (close == std::string_view::npos) invalid("unterminated group name", at);
            i_ = close + 1;
          } else {
            unsupported("the group '(?" + std::string(rest.substr(1, 1)) + "' (flags?)", at);
          }
        }
        Node inner = parse_alternation(depth + 1);
        if (!peek(')')) invalid("'(' without its ')'", at);
        ++i_;
        return inner;
      }
      case '[':
        return Node::of_set(parse_class());
      case '.':
        ++i_;
        return Node::of_set(dot_set());
      case '\\':
        return Node::of_set(parse_escape(false));
      case '*':
      case '+':
      case '?':
        invalid("nothing to repeat", at);
      case '{':
        invalid("'{' that is not a quantifier {n}, {n,} or {n,m} (write \\{)", at);
      default: {
        const uint32_t cp = next_code_point();
        return Node::of_set({{cp, cp}});
      }
    }
  }

  // A literal character, UTF-8 decoded.
  uint32_t next_code_point() {
    const size_t at = i_;
    const auto b = static_cast<uint8_t>(p_[i_++]);
    if (b < 0x80) return b;
    int n = b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc0 ? 1 : -1;
    if (n < 0 || b > 0xf4) invalid("a byte that is not UTF-8", at);
    uint32_t cp = b & (0x3f >> n);
    for (int k = 0; k < n; ++k) {
      if (i_ >= p_.size() || (static_cast<uint8_t>(p_[i_]) & 0xc0) != 0x80)
        invalid("a byte that is not UTF-8", at);
      cp = (cp << 6) | (static_cast<uint8_t>(p_[i_++]) & 0x3f);
    }
    return cp;
  }

  uint32_t hex(int digits, size_t at) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      const char h = i_ < p_.size() ? p_[i_] : '\0';
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) invalid("a \\x or \\u escape without its hex digits", at);
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // After '\': the set it stands for. In a class \b is a backspace.
  CharSet parse_escape(bool in_class) {
    const size_t at = i_;
    ++i_;
    if (i_ >= p_.size()) invalid("a '\\' at the end", at);
    const char e = p_[i_++];
    auto one = [](uint32_t c) { return CharSet{{c, c}}; };
    switch (e) {
      case 'd':
        return digit_set();
      case 'D':
        return complement(digit_set());
      case 'w':
        return word_set();
      case 'W':
        return complement(word_set());
      case 's':
        return space_set();
      case 'S':
        return complement(space_set());
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 't':
        return one('\t');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case '0':
        if (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9')
          unsupported("an octal escape '\\0" + std::string(1, p_[i_]) + "'", at);
        return one(0);
      case 'x':
        return one(hex(2, at));
      case 'u': {
        if (peek('{')) unsupported("the escape '\\u{...}' (it needs the u flag)", at);
        const uint32_t cp = hex(4, at);
        if (cp >= 0xd800 && cp <= 0xdfff)
          unsupported("a surrogate escape '\\u" + std::string(p_.substr(at + 2, 4)) + "'", at);
        return one(cp);
      }
      case 'b':
        if (in_class) return one('\b');
        unsupported("the word boundary '\\b'", at);
      case 'B':
        unsupported("the word boundary '\\B'", at);
      case 'c':
        unsupported("the control escape '\\c'", at);
      case 'k':
        unsupported("the backreference '\\k'", at);
      case 'p':
      case 'P':
        unsupported("the Unicode property escape '\\" + std::string(1, e) + "'", at);
      default:
        break;
    }
    if (e >= '1' && e <= '9') unsupported("the backreference '\\" + std::string(1, e) + "'", at);
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
      invalid("unknown escape '\\" + std::string(1, e) + "'", at);
    --i_;
    return one(next_code_point());
  }

  CharSet parse_class() {
    const size_t at = i_;
    ++i_;
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++i_;
    }
    CharSet s;
    // One class member: a single code point (second = true) or an escape's set.
    auto member = [&]() -> std::pair<CharSet, bool> {
      if (peek('\\')) {
        CharSet m = parse_escape(true);
        return {m, m.size() == 1 && m[0].first == m[0].second};
      }
      const uint32_t c = next_code_point();
      return {{{c, c}}, true};
    };
    for (;;) {
      if (i_ >= p_.size()) invalid("'[' without its ']'", at);
      if (peek(']')) {
        ++i_;
        break;
      }
      if (peek('[') && i_ + 1 < p_.size() &&
          (p_[i_ + 1] == ':' || p_[i_ + 1] == '=' || p_[i_ + 1] == '.'))
        unsupported("a POSIX class '[" + std::string(1, p_[i_ + 1]) + "'", i_);
      const size_t from = i_;
      auto [lo, single] = member();
      if (peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        auto [hi, single_hi] = member();
        if (!single || !single_hi) invalid("a range with a class escape as its end", from);
        if (hi[0].first < lo[0].first) invalid("a range out of order", from);
        s.emplace_back(lo[0].first, hi[0].first);
      } else {
        s.insert(s.end(), lo.begin(), lo.end());
      }
    }
    s = normalized(std::move(s));
    if (negate) s = complement(s);
    if (s.empty()) unsupported("a character class that matches no character", at);
    return s;
  }

  std::string_view p_;
  std::string context_;
  size_t i_ = 0;
};

int utf8_encode(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xc0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xe0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3f));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3f));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xf0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3f));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3f));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3f));
  return 4;
}

// The UTF-8 encodings of [lo, hi] as sequences of byte ranges (surrogates left out).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Sequence>& out) {
  if (lo > hi) return;
  if (lo <= 0xdfff && hi >= 0xd800) {
    if (lo < 0xd800) utf8_sequences(lo, 0xd7ff, out);
    if (hi > 0xdfff) utf8_sequences(0xe000, hi, out);
    return;
  }
  for (uint32_t edge : {0x7fu, 0x7ffu, 0xffffu}) {
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back(
        {Element::of(ByteSet::range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)))});
    return;
  }
  // Split until every continuation byte position spans a whole 0x80..0xbf or a fixed prefix.
  for (int k = 1; k < 4; ++k) {
    const uint32_t m = (uint32_t{1} << (6 * k)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  const int n = utf8_encode(lo, a);
  utf8_encode(hi, b);
  Sequence s;
  for (int k = 0; k < n; ++k) s.push_back(Element::of(ByteSet::range(a[k], b[k])));
  out.push_back(std::move(s));
}

class Compiler {
 public:
  Compiler(Grammar& g, const RegexOptions& o, std::string context)
      : g_(g), o_(o), context_(std::move(context)) {}

  int32_t compile(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kSet:
        return set_rule(n.set);
      case Node::Kind::kConcat: {
        Sequence s;
        for (const Node& k : n.kids) s.push_back(Element::ref(compile(k)));
        const int32_t r = g_.add_rule("regex seq");
        g_.add_alternative(r, s);
        return r;
      }
      case Node::Kind::kAlt: {
        std::vector<int32_t> kids;
        for (const Node& k : n.kids) kids.push_back(compile(k));
        const int32_t r = g_.add_rule("regex alt");
        for (int32_t k : kids) g_.add_alternative(r, {Element::ref(k)});
        return r;
      }
      case Node::Kind::kRepeat:
        return repeat(n);
    }
    return -1;
  }

  int32_t set_rule(const CharSet& set) {
    std::vector<Sequence> alts;
    std::vector<uint32_t> escaped;
    for (auto [lo, hi] : set) {
      if (o_.json_string) {
        // Characters a JSON string must escape go to one escape rule; the rest as UTF-8.
        for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5c); ++c) {
          if (c < 0x20 || c == '"' || c == '\\') escaped.push_back(c);
        }
        std::vector<std::pair<uint32_t, uint32_t>> plain;
        uint32_t from = lo;
        for (uint32_t c : {0x1fu, 0x22u, 0x5cu}) {
          if (c < from || c > hi) continue;
          if (c > from) plain.emplace_back(from, c - 1);
          from = c + 1;
        }
        if (from <= hi) plain.emplace_back(from, hi);
        for (auto [a, b] : plain) {
          if (a < 0x20) a = 0x20;
          if (a <= b) utf8_sequences(a, b, alts);
        }
      } else {
        utf8_sequences(lo, hi, alts);
      }
    }
    if (!escaped.empty()) alts.push_back({byte('\\'), Element::ref(escape_rule(escaped))});
    LONGCTX_CHECK(!alts.empty(), ErrorCode::kUnsupported,
                  "{}: a character class that matches no character is not supported", context_);
    const int32_t r = g_.add_rule("regex chars");
    for (const Sequence& s : alts) g_.add_alternative(r, s);
    return r;
  }

  int32_t any_star() {
    Node star;
    star.kind = Node::Kind::kRepeat;
    star.lo = 0;
    star.hi = kUnbounded;
    star.kids.push_back(Node::of_set({{0, kMaxCodePoint}}));
    return compile(star);
  }

 private:
  static Element byte(char c) { return Element::of(ByteSet::single(static_cast<uint8_t>(c))); }

  // The letter of c's two-character JSON escape (0: none).
  static char short_escape(uint32_t c) {
    switch (c) {
      case '"':
        return '"';
      case '\\':
        return '\\';
      case '\b':
        return 'b';
      case '\f':
        return 'f';
      case '\n':
        return 'n';
      case '\r':
        return 'r';
      case '\t':
        return 't';
      default:
        return 0;
    }
  }

  // After a '\\': the escapes of `chars` (", \\ and control characters), the short ones where
  // JSON has them; all 32 control characters as one \u00XX alternative.
  int32_t escape_rule(const std::vector<uint32_t>& chars) {
    ByteSet short_forms;
    std::vector<uint32_t> long_forms;
    for (uint32_t c : chars) {
      if (const char letter = short_escape(c); letter != 0) {
        short_forms.add(static_cast<uint8_t>(letter));
      } else {
        long_forms.push_back(c);
      }
    }
    const int32_t r = g_.add_rule("regex escape");
    if (short_forms.bits != ByteSet{}.bits) g_.add_alternative(r, {Element::of(short_forms)});
    const size_t controls = static_cast<size_t>(
        std::count_if(chars.begin(), chars.end(), [](uint32_t c) { return c < 0x20; }));
    if (controls == 32) {
      ByteSet hex = ByteSet::range('0', '9');
      hex.add_range('a', 'f');
      g_.add_alternative(r, {byte('u'), byte('0'), byte('0'), Element::of(ByteSet::range('0', '1')),
                             Element::of(hex)});
      return r;
    }
    static const char* kHex = "0123456789abcdef";
    for (uint32_t c : long_forms) {
      g_.add_alternative(r, Grammar::literal(std::string("u00") + kHex[c >> 4] + kHex[c & 15]));
    }
    return r;
  }

  int32_t repeat(const Node& n) {
    const Node* body = &n.kids[0];
    std::optional<Node> stripped;
    if (n.hi == kUnbounded && nullable(*body)) {
      // (x)* over an x that can be empty loops over x's non-empty strings.
      stripped = non_empty(*body);
      if (!stripped) return empty_rule();
      body = &*stripped;
    }
    const int32_t x = compile(*body);
    const int32_t r = g_.add_rule("regex repeat");
    // Repetitions of a nullable body that may all be empty: at least lo of them adds nothing.
    Sequence s(stripped ? 0 : static_cast<size_t>(n.lo), Element::ref(x));
    if (n.hi == kUnbounded) {
      const int32_t star = g_.add_rule("regex star");
      g_.add_alternative(star, {});
      g_.add_alternative(star, {Element::ref(x), Element::ref(star)});
      s.push_back(Element::ref(star));
    } else if (n.hi > n.lo) {
      // opt[k]: up to hi - lo - k more.
      int32_t next = -1;
      for (int64_t k = n.hi - n.lo; k >= 1; --k) {
        const int32_t opt = g_.add_rule("regex optional");
        g_.add_alternative(opt, {});
        Sequence more{Element::ref(x)};
        if (next >= 0) more.push_back(Element::ref(next));
        g_.add_alternative(opt, more);
        next = opt;
      }
      s.push_back(Element::ref(next));
    }
    g_.add_alternative(r, s);
    return r;
  }

  int32_t empty_rule() {
    const int32_t r = g_.add_rule("regex empty");
    g_.add_alternative(r, {});
    return r;
  }

  Grammar& g_;
  const RegexOptions& o_;
  std::string context_;
};

}  // namespace

int32_t add_regex_rule(Grammar& g, std::string_view pattern, const RegexOptions& options) {
  Parser parser(pattern, options.context);
  const std::vector<Parser::Branch> branches = parser.parse_top();
  Compiler c(g, options, options.context);
  const int32_t r = g.add_rule("regex");
  int32_t any = -1;
  for (const Parser::Branch& b : branches) {
    Sequence s;
    const bool open_start = options.search && !b.start_anchor;
    const bool open_end = options.search && !b.end_anchor;
    if ((open_start || open_end) && any < 0) any = c.any_star();
    if (open_start) s.push_back(Element::ref(any));
    s.push_back(Element::ref(c.compile(b.node)));
    if (open_end) s.push_back(Element::ref(any));
    g.add_alternative(r, s);
  }
  return r;
}

Grammar regex_grammar(std::string_view pattern) {
  Grammar g;
  g.set_root(add_regex_rule(g, pattern, RegexOptions{}));
  g.finalize();
  return g;
}

Grammar choice_grammar(const std::vector<std::string>& choices) {
  LONGCTX_CHECK(!choices.empty(), ErrorCode::kInvalidArgument, "choice: the list is empty");
  // A trie, a rule per node: choices sharing a prefix are one reading until they part, so many
  // similar choices never multiply the live stacks.
  struct TrieNode {
    bool end = false;
    std::map<uint8_t, size_t> kids;
  };
  std::vector<TrieNode> trie(1);
  for (const std::string& c : choices) {
    size_t at = 0;
    for (char ch : c) {
      const auto b = static_cast<uint8_t>(ch);
      auto it = trie[at].kids.find(b);
      if (it == trie[at].kids.end()) {
        it = trie[at].kids.emplace(b, trie.size()).first;
        trie.emplace_back();
      }
      at = it->second;
    }
    trie[at].end = true;
  }
  LONGCTX_CHECK(trie.size() < Grammar::kMaxElements / 2, ErrorCode::kUnsupported,
                "choice: more than {} bytes of choices", Grammar::kMaxElements / 2);
  Grammar g;
  for (size_t n = 0; n < trie.size(); ++n) g.add_rule("choice");
  for (size_t n = 0; n < trie.size(); ++n) {
    const auto r = static_cast<int32_t>(n);
    if (trie[n].end) g.add_alternative(r, {});
    for (const auto& [b, kid] : trie[n].kids) {
      g.add_alternative(r,
                        {Element::of(ByteSet::single(b)), Element::ref(static_cast<int32_t>(kid))});
    }
  }
  g.set_root(0);
  g.finalize();
  return g;
}

}  // namespace longctx::structured
