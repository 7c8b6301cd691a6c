// String helpers with Python semantics, working on code points so multi-byte characters are
// never split. Case mapping covers Latin, Greek and Cyrillic (one-to-one, plus "ß" -> "SS").
#pragma once

#include <cstdint>
#include <string>

#include "template/value.h"

namespace longctx::jinja {

std::string str_upper(const std::string& s);
std::string str_lower(const std::string& s);
std::string py_capitalize(const std::string& s);  // first character upper, the rest lower
std::string py_title(const std::string& s);       // Jinja's title filter
std::string py_str_title(const std::string& s);   // Python's str.title()
// str.strip(chars) / lstrip / rstrip; chars == nullptr strips Unicode whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
// str.replace(old, new, count); count < 0 replaces all.
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count);
// printf-style `fmt % args` (%s %r %d %i %f %e %g %x %X %%, with flags, width and precision).
std::string percent_format(const std::string& fmt, const Array& args);

}  // namespace longctx::jinja
