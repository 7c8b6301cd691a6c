#include "template/util.h"

#include <cstdio>
#include <string_view>

namespace longctx::jinja {

std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}

std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  return ascii_upper(s.substr(0, 1)) + ascii_lower(s.substr(1));
}

std::string py_title(const std::string& s) {
  // Jinja capitalizes each word, a word starting after whitespace, '-', or an opening bracket.
  std::string out;
  bool start = true;
  for (char c : s) {
    out += start ? ascii_upper(std::string(1, c)) : ascii_lower(std::string(1, c));
    start = std::string_view(" \t\n\r\v\f-([{<").find(c) != std::string_view::npos;
  }
  return out;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : is_py_space(c);
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts `repl` around every character
    std::u32string u = utf8_decode(s);
    for (char32_t c : u) {
      if (count < 0 || done < count) {
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
    char buf[512];
    if (type == 's' || type == 'r') {
      std::string text = type == 's' ? v.str() : v.repr();
      std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), text.c_str());
      out += spec.size() > 1 ? std::string(buf) : text;
    } else if (std::string_view("dixX").find(type) != std::string_view::npos) {
      if (!v.is_number())
        fail("%" + std::string(1, type) + " format: a number is required, not " + v.type_name());
      std::snprintf(
          buf, sizeof(buf), (spec + "ll" + (type == 'i' ? 'd' : type)).c_str(),
          static_cast<long long>(v.is_float() ? static_cast<int64_t>(v.as_float()) : v.as_int()));
      out += buf;
    } else if (std::string_view("fFeEgG").find(type) != std::string_view::npos) {
      if (!v.is_number())
        fail("%" + std::string(1, type) + " format: a number is required, not " + v.type_name());
      std::snprintf(buf, sizeof(buf), (spec + type).c_str(), v.as_float());
      out += buf;
    } else {
      fail(std::string("unsupported format character '") + type + "'");
    }
  }
  if (next < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace longctx::jinja
