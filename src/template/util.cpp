#include "template/util.h"

#include <cstdio>
#include <string_view>

namespace longctx::jinja {

namespace {

// Simple (one-to-one) case mapping for Latin-1, Latin Extended-A, Greek, Cyrillic and
// full-width Latin, which covers what templates meet; other scripts are left unchanged.
struct CaseRange {
  char32_t lo, hi;  // lowercase range
  int32_t delta;    // upper = lower + delta
};
constexpr CaseRange kRanges[] = {
    {'a', 'z', -32},     {0xE0, 0xF6, -32},     {0xF8, 0xFE, -32},   {0x3B1, 0x3C1, -32},
    {0x3C3, 0x3CB, -32}, {0x3AD, 0x3AF, -37},   {0x3CD, 0x3CE, -63}, {0x430, 0x44F, -32},
    {0x450, 0x45F, -80}, {0xFF41, 0xFF5A, -32},
};
constexpr std::pair<char32_t, char32_t> kSingles[] = {  // {lower, upper}
    {0xFF, 0x178},
    {0x3AC, 0x386},
    {0x3CC, 0x38C},
    {0x3C2, 0x3A3}};

// Latin Extended-A and Cyrillic pair blocks alternate upper (even) / lower (odd) code points,
// except 0x139..0x148 and 0x179..0x17E where the upper case is odd.
bool in_pair_block(char32_t c, bool* odd_upper) {
  *odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
  return (c >= 0x100 && c <= 0x137) || *odd_upper || (c >= 0x14A && c <= 0x177) ||
         (c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF);
}

char32_t to_upper(char32_t c) {
  for (const auto& r : kRanges)
    if (c >= r.lo && c <= r.hi) return static_cast<char32_t>(c + r.delta);
  for (const auto& [lo, up] : kSingles)
    if (c == lo) return up;
  bool odd_upper;
  if (in_pair_block(c, &odd_upper) && (c % 2 == 1) != odd_upper) return c - 1;
  return c;
}

char32_t to_lower(char32_t c) {
  for (const auto& r : kRanges) {
    char32_t lo = static_cast<char32_t>(r.lo + r.delta), hi = static_cast<char32_t>(r.hi + r.delta);
    if (c >= lo && c <= hi) return static_cast<char32_t>(c - r.delta);
  }
  for (const auto& [lo, up] : kSingles)
    if (c == up && lo != 0x3C2) return lo;
  bool odd_upper;
  if (in_pair_block(c + 1, &odd_upper) && (c % 2 == 1) == odd_upper) return c + 1;
  return c;
}

std::string map_case(const std::string& s, bool upper) {
  std::u32string u = utf8_decode(s);
  std::u32string out;
  for (char32_t c : u) {
    if (upper && c == 0xDF) {  // Python: "ß".upper() == "SS"
      out += U"SS";
      continue;
    }
    out += upper ? to_upper(c) : to_lower(c);
  }
  return utf8_encode(out);
}

}  // namespace

std::string str_upper(const std::string& s) { return map_case(s, true); }
std::string str_lower(const std::string& s) { return map_case(s, false); }

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  std::u32string u = utf8_decode(s);
  return str_upper(utf8_encode(u.substr(0, 1))) + str_lower(utf8_encode(u.substr(1)));
}

std::string py_title(const std::string& s) {
  // Jinja capitalizes each word, a word starting after whitespace, '-', or an opening bracket.
  std::string out;
  bool start = true;
  for (char32_t c : utf8_decode(s)) {
    std::string ch = utf8_encode(std::u32string_view(&c, 1));
    out += start ? str_upper(ch) : str_lower(ch);
    start = is_py_space(c) || std::u32string_view(U"-([{<").find(c) != std::u32string_view::npos;
  }
  return out;
}

// Decodes the code point starting at byte i (lengths as utf8_decode, invalid bytes one byte).
static char32_t code_point_at(const std::string& s, size_t i, size_t* len) {
  size_t n = 1;
  auto b = static_cast<unsigned char>(s[i]);
  if (b >= 0xC0) n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  if (i + n > s.size()) n = 1;
  std::u32string c = utf8_decode(std::string_view(s).substr(i, n));
  *len = c.size() == 1 ? n : 1;
  return c[0];
}

// Scans by code point without decoding the whole string: chat messages can be long.
std::string py_str_title(const std::string& s) {
  // Python str.title(): a cased character is upper after an uncased one, lower after a cased one.
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    bool cased = to_upper(c) != c || to_lower(c) != c || c == 0xDF;
    std::string ch = utf8_encode(std::u32string_view(&c, 1));
    out += cased ? (prev_cased ? str_lower(ch) : str_upper(ch)) : ch;
    prev_cased = cased;
  }
  return out;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : is_py_space(c);
  };
  size_t b = 0, e = s.size(), len = 0;
  if (left)
    while (b < e && strip_it(code_point_at(s, b, &len))) b += len;
  if (right) {
    while (e > b) {
      size_t start = e - 1;  // back up over continuation bytes to the code point's first byte
      while (start > b && e - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
        --start;
      char32_t c = code_point_at(s, start, &len);
      if (start + len != e) {  // not a well-formed sequence ending at e: take the last byte alone
        start = e - 1;
        c = code_point_at(s, start, &len);
      }
      if (!strip_it(c)) break;
      e = start;
    }
  }
  return s.substr(b, e - b);
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts `repl` around every character
    std::u32string u = utf8_decode(s);
    for (char32_t c : u) {
      if (count < 0 || done < count) {
        charge_bytes(repl.size());  // `repl` is inserted once per character
        out += repl;
        ++done;
      }
      out += utf8_encode(std::u32string_view(&c, 1));
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  size_t start = 0;
  for (size_t p = s.find(old); p != std::string::npos && (count < 0 || done < count);
       p = s.find(old, start)) {
    charge_bytes(p - start + repl.size());
    out += s.substr(start, p - start) + repl;
    start = p + old.size();
    ++done;
  }
  return out + s.substr(start);
}

std::string percent_format(const std::string& fmt, const Array& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t j = i + 1;
    while (j < fmt.size() && std::string_view("-+ #0").find(fmt[j]) != std::string_view::npos) ++j;
    while (j < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[j])) || fmt[j] == '.'))
      ++j;
    if (j >= fmt.size()) fail("incomplete format in '" + fmt + "'");
    char type = fmt[j];
    std::string spec = fmt.substr(i, j - i);
    i = j;
    if (type == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) fail("not enough arguments for format string");
    const Value& v = args[next++];
    // Width and precision come from the template: parsed here (they may be huge) and applied
    // without fixed-size buffers, so nothing is truncated and a huge width is a budget error.
    bool left = spec.find('-') != std::string::npos;
    size_t k = 1;
    while (k < spec.size() && std::string_view("-+ #0").find(spec[k]) != std::string_view::npos)
      ++k;
    auto read_number = [&](size_t& pos) -> int64_t {
      int64_t n = 0;
      for (; pos < spec.size() && std::isdigit(static_cast<unsigned char>(spec[pos])); ++pos) {
        n = n * 10 + (spec[pos] - '0');
        if (n > (int64_t{1} << 30)) fail("format width or precision too large in '" + fmt + "'");
      }
      return n;
    };
    const int64_t width = read_number(k);
    int64_t precision = -1;
    if (k < spec.size() && spec[k] == '.') {
      ++k;
      precision = read_number(k);
    }
    if (k != spec.size()) fail("malformed format specifier '" + spec + type + "'");
    charge_bytes(static_cast<uint64_t>(width));
    if (type == 's' || type == 'r') {
      std::string text = type == 's' ? v.str() : v.repr();
      if (precision >= 0 || width > 0) {  // counted in code points, as Python does
        std::u32string u = utf8_decode(text);
        if (precision >= 0 && static_cast<size_t>(precision) < u.size()) u.resize(precision);
        std::string pad(
            width > static_cast<int64_t>(u.size()) ? width - static_cast<int64_t>(u.size()) : 0,
            ' ');
        text = left ? utf8_encode(u) + pad : pad + utf8_encode(u);
      }
      out += text;
      continue;
    }
    std::string cspec;
    if (std::string_view("dixX").find(type) != std::string_view::npos) {
      if (!v.is_number())
        fail("%" + std::string(1, type) + " format: a number is required, not " + v.type_name());
      cspec = spec + "ll" + (type == 'i' ? 'd' : type);
    } else if (std::string_view("fFeEgG").find(type) != std::string_view::npos) {
      if (!v.is_number())
        fail("%" + std::string(1, type) + " format: a number is required, not " + v.type_name());
      cspec = spec + type;
    } else {
      fail(std::string("unsupported format character '") + type + "'");
    }
    auto print = [&](char* buf, size_t size) {
      if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' || type == 'G')
        return std::snprintf(buf, size, cspec.c_str(), v.as_float());
      double d = v.is_float() ? v.as_float() : 0;
      if (v.is_float() && !(d > -9223372036854775808.0 - 1024 && d < 9223372036854775808.0))
        fail("%" + std::string(1, type) + " format: " + format_float(d) + " is out of range");
      return std::snprintf(
          buf, size, cspec.c_str(),
          static_cast<long long>(v.is_float() ? static_cast<int64_t>(d) : v.as_int()));
    };
    int n = print(nullptr, 0);
    if (n < 0) fail("cannot format with '" + spec + type + "'");
    charge_bytes(static_cast<uint64_t>(n));
    std::string piece(static_cast<size_t>(n) + 1, '\0');
    print(piece.data(), piece.size());
    piece.resize(static_cast<size_t>(n));
    out += piece;
  }
  if (next < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace longctx::jinja
