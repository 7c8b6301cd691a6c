#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace longctx::jinja {

void fail(const std::string& message) { throw RenderError(message); }

namespace {
thread_local BudgetScope* t_budget = nullptr;
}  // namespace

BudgetScope::BudgetScope(const RenderLimits& limits) : limits_(limits), previous_(t_budget) {
  t_budget = this;
}

BudgetScope::~BudgetScope() { t_budget = previous_; }

BudgetScope::Nest::Nest() {
  BudgetScope* b = t_budget;
  if (!b) return;
  if (b->depth_ >= b->limits_.max_depth)
    fail("template nested too deeply while rendering (more than " +
         std::to_string(b->limits_.max_depth) + " levels of expressions, blocks and macro calls)");
  ++b->depth_;
}

BudgetScope::Nest::~Nest() {
  if (t_budget) --t_budget->depth_;
}

void charge_bytes(uint64_t bytes) {
  BudgetScope* b = t_budget;
  if (!b) return;
  const auto limit = static_cast<uint64_t>(b->limits_.max_bytes);
  if (bytes > limit || b->bytes_ > limit - bytes)
    fail("template exceeded its memory budget: " + std::to_string(limit) +
         " bytes of strings and lists in one render");
  b->bytes_ += bytes;
}

void charge_steps(int64_t steps) {
  BudgetScope* b = t_budget;
  if (!b) return;
  if (steps > b->limits_.max_steps - b->steps_)
    fail("template exceeded its step budget: " + std::to_string(b->limits_.max_steps) +
         " evaluation steps in one render (a runaway loop?)");
  b->steps_ += steps;
}

int Value::depth() const {
  if (is_array()) return array_box().depth;
  if (is_object()) return as_object().depth;
  return 0;
}

bool Value::has_namespace() const {
  if (is_array()) return array_box().has_namespace;
  if (is_object()) return as_object().has_namespace;
  return false;
}

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < positional.size()) return &positional[i];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

namespace {
void check_depth(int depth) {
  if (depth > kMaxValueDepth)
    fail("value nested too deeply (more than " + std::to_string(kMaxValueDepth) +
         " levels of lists and dicts)");
}
}  // namespace

Value Value::array(Array items, bool tuple) {
  charge_bytes(items.size() * sizeof(Value));
  ArrayBox box{std::move(items), tuple};
  for (const Value& item : box.items) {
    box.depth = std::max(box.depth, item.depth() + 1);
    box.has_namespace = box.has_namespace || item.has_namespace();
  }
  check_depth(box.depth);
  Value v;
  v.v_ = std::make_shared<ArrayBox>(std::move(box));
  return v;
}

Value Value::object(Object object) {
  charge_bytes(object.entries.size() * (sizeof(Value) + sizeof(std::string)));
  object.depth = 1;
  object.has_namespace = object.is_namespace;
  for (const auto& [k, item] : object.entries) {
    object.depth = std::max(object.depth, item.depth() + 1);
    object.has_namespace = object.has_namespace || item.has_namespace();
  }
  check_depth(object.depth);
  Value v;
  v.v_ = std::make_shared<Object>(std::move(object));
  return v;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v;
  v.v_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

void Value::type_error(const char* expected) const {
  if (is_undefined()) require_defined();
  fail(std::string("expected ") + expected + ", got " + type_name());
}

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return get<int64_t>("int");
}

double Value::as_float() const {
  if (is_float()) return std::get<double>(v_);
  if (!is_int() && !is_bool()) type_error("a number");
  return static_cast<double>(as_int());
}

void Value::require_defined() const {
  if (is_undefined()) fail(undefined_hint());
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_float() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_array()) return !as_array().empty();
  if (is_mapping()) return !as_object().entries.empty();
  return true;  // namespaces, callables
}

std::string Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_array()) return is_tuple() ? "tuple" : "list";
  if (is_namespace()) return "Namespace";
  if (is_object()) return "dict";
  return "function";
}

namespace {

void append_hex(std::string& out, const char* prefix, uint32_t v, int digits) {
  static const char* kHex = "0123456789abcdef";
  out += prefix;
  for (int i = digits - 1; i >= 0; --i) out += kHex[(v >> (4 * i)) & 0xF];
}

std::string py_repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7f && c < 0xa0)) {
      append_hex(out, "\\x", c, 2);
    } else if (c < 0x80) {
      out += static_cast<char>(c);  // fast path: no string per character
    } else {
      out += utf8_encode(std::u32string_view(&c, 1));
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::repr() const {
  if (is_undefined()) return "Undefined";  // how Jinja's Undefined prints inside a list
  if (is_string()) return py_repr_string(as_string());
  if (is_array()) {
    const Array& items = as_array();
    std::string out = is_tuple() ? "(" : "[";
    for (size_t i = 0; i < items.size(); ++i) {
      // A list may hold one big string many times over: charge every copy printed.
      std::string item = items[i].repr();
      charge_bytes(item.size() + 2);
      out += (i ? ", " : "") + item;
    }
    if (is_tuple() && items.size() == 1) out += ",";
    return out + (is_tuple() ? ")" : "]");
  }
  if (is_object()) {
    std::string out = is_namespace() ? "<Namespace {" : "{";
    bool first = true;
    for (const auto& [k, v] : as_object().entries) {
      std::string item = py_repr_string(k) + ": " + v.repr();
      charge_bytes(item.size() + 2);
      out += (first ? "" : ", ") + item;
      first = false;
    }
    return out + (is_namespace() ? "}>" : "}");
  }
  return str();
}

std::string Value::str() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return format_float(as_float());
  if (is_string()) return as_string();
  if (is_callable()) return "<function " + as_callable().name + ">";
  return repr();
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    if (a.is_tuple() != b.is_tuple() || x.size() != y.size()) return false;
    charge_steps(static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i])) return false;
    return true;
  }
  if (a.is_mapping() && b.is_mapping()) {
    const auto &x = a.as_object().entries, &y = b.as_object().entries;
    if (x.size() != y.size()) return false;
    charge_steps(static_cast<int64_t>(x.size() * y.size()));  // find() is a linear scan
    for (const auto& [k, v] : x) {
      const Value* other = b.as_object().find(k);
      if (!other || !equals(v, *other)) return false;
    }
    return true;
  }
  if (a.is_object() && b.is_object()) return &a.as_object() == &b.as_object();
  if (a.is_callable() && b.is_callable()) return &a.as_callable() == &b.as_callable();
  return false;
}

int compare(const Value& a, const Value& b) {
  a.require_defined();
  b.require_defined();
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float())
      return (a.as_int() > b.as_int()) - (a.as_int() < b.as_int());
    double x = a.as_float(), y = b.as_float();
    return (x > y) - (x < y);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order == code point order
    return (c > 0) - (c < 0);
  }
  if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
    const Array &x = a.as_array(), &y = b.as_array();
    charge_steps(static_cast<int64_t>(std::min(x.size(), y.size())));
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return (x.size() > y.size()) - (x.size() < y.size());
  }
  fail("comparison not supported between instances of '" + a.type_name() + "' and '" +
       b.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string())
      fail("'in <string>' requires string as left operand, not " + item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_array()) {
    charge_steps(static_cast<int64_t>(container.as_array().size()));
    for (const Value& v : container.as_array())
      if (equals(v, item)) return true;
    return false;
  }
  if (container.is_mapping())
    return item.is_string() && container.as_object().find(item.as_string());
  fail("argument of type '" + container.type_name() + "' is not iterable");
}

Array iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_array()) return v.as_array();
  if (v.is_mapping()) {
    Array keys;
    for (const auto& [k, _] : v.as_object().entries) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    Array chars;
    for (char32_t c : utf8_decode(v.as_string()))
      chars.emplace_back(utf8_encode(std::u32string_view(&c, 1)));
    return chars;
  }
  fail("'" + v.type_name() + "' object is not iterable");
}

int64_t length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) {
    const std::string& s = v.as_string();
    bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
    return static_cast<int64_t>(ascii ? s.size() : utf8_decode(s).size());
  }
  if (v.is_array()) return static_cast<int64_t>(v.as_array().size());
  if (v.is_mapping()) return static_cast<int64_t>(v.as_object().entries.size());
  fail("object of type '" + v.type_name() + "' has no len()");
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  size_t e = s.find('e');
  int exp = std::stoi(s.substr(e + 1));
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  // Python's repr switches to exponent notation outside 1e-4 <= |d| < 1e16.
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    std::string e_digits = std::to_string(std::abs(exp));
    if (e_digits.size() < 2) e_digits = "0" + e_digits;
    return out + "e" + (exp < 0 ? "-" : "+") + e_digits;
  }
  if (exp < 0) return sign + "0." + std::string(-exp - 1, '0') + digits;
  size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len)
    return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          append_hex(out, "\\u", c, 4);
        } else if (ensure_ascii && c >= 0x80) {
          if (c >= 0x10000) {
            append_hex(out, "\\u", 0xD800 + ((c - 0x10000) >> 10), 4);
            append_hex(out, "\\u", 0xDC00 + ((c - 0x10000) & 0x3FF), 4);
          } else {
            append_hex(out, "\\u", c, 4);
          }
        } else if (c < 0x80) {
          out += static_cast<char>(c);
        } else {
          out += utf8_encode(std::u32string_view(&c, 1));
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonOptions& opt, int depth) {
  bool pretty = opt.indent >= 0 || !opt.indent_str.empty();
  std::string item_sep = opt.separators ? opt.separators->first : (pretty ? "," : ", ");
  std::string key_sep = opt.separators ? opt.separators->second : ": ";
  auto newline = [&](int level) {
    if (!pretty) return;
    out += '\n';
    const std::string one = opt.indent_str.empty() ? std::string() : opt.indent_str;
    const uint64_t width = opt.indent_str.empty() ? static_cast<uint64_t>(opt.indent) : one.size();
    charge_bytes(width * static_cast<uint64_t>(level));  // before building: indent can be 2e9
    for (int i = 0; i < level; ++i) {
      if (opt.indent_str.empty())
        out.append(static_cast<size_t>(opt.indent), ' ');
      else
        out += one;
    }
  };
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    double d = v.as_float();
    out += std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                           : format_float(d);
  } else if (v.is_string()) {
    json_string(out, v.as_string(), opt.ensure_ascii);
  } else if (v.is_array()) {
    const Array& items = v.as_array();
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      json_value(out, items[i], opt, depth + 1);
    }
    newline(depth);
    out += ']';
  } else if (v.is_mapping()) {
    auto entries = v.as_object().entries;
    if (entries.empty()) {
      out += "{}";
      return;
    }
    if (opt.sort_keys)
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    out += '{';
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      json_string(out, entries[i].first, opt.ensure_ascii);
      out += key_sep;
      json_value(out, entries[i].second, opt, depth + 1);
    }
    newline(depth);
    out += '}';
  } else {
    if (v.is_undefined()) v.require_defined();
    fail("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

template <typename Json>
Value convert(const Json& j, int depth) {
  // Checked on the way down: a context nested 300,000 deep must not recurse that far.
  if (depth > kMaxValueDepth)
    fail("the template context is nested too deeply (more than " + std::to_string(kMaxValueDepth) +
         " levels)");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value(nullptr);
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Array items;
      for (const auto& e : j) items.push_back(convert(e, depth + 1));
      return Value::array(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Object obj;
      for (auto it = j.begin(); it != j.end(); ++it)
        obj.entries.emplace_back(it.key(), convert(*it, depth + 1));
      return Value::object(std::move(obj));
    }
    default:
      return Value::undefined("unsupported JSON value (binary or discarded)");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(out, v, options, 0);
  return out;
}

Value from_json(const nlohmann::json& j) { return convert(j, 1); }
Value from_json(const nlohmann::ordered_json& j) { return convert(j, 1); }

// Invalid bytes decode to U+DC80..U+DCFF (Python's surrogateescape) so they survive a round trip.
std::u32string utf8_decode(std::string_view s) {
  charge_bytes(s.size() * sizeof(char32_t));  // templates index strings by decoding them
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto b = static_cast<unsigned char>(s[i]);
    int n = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
    char32_t c = n == 0 ? b : n == 1 ? (b & 0x1F) : n == 2 ? (b & 0x0F) : (b & 0x07);
    bool ok = n >= 0;
    for (int k = 1; ok && k <= n; ++k) {
      if (i + k >= s.size()) {
        ok = false;
        break;
      }
      auto cb = static_cast<unsigned char>(s[i + k]);
      if ((cb & 0xC0) != 0x80) ok = false;
      c = (c << 6) | (cb & 0x3F);
    }
    if (!ok) {
      out += static_cast<char32_t>(0xDC00 + b);
      ++i;
      continue;
    }
    out += c;
    i += n + 1;
  }
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) {
    if (c >= 0xDC80 && c <= 0xDCFF) {
      out += static_cast<char>(c - 0xDC00);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

}  // namespace longctx::jinja
