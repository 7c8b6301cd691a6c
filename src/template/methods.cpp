// Item/attribute access, slicing, arithmetic, the Python str/dict/list methods templates call,
// and the globals transformers installs. Python semantics throughout (floor division, negative
// indices, str.split rules), since the reference renderer is Python's jinja2.
#include <algorithm>
#include <cmath>
#include <ctime>

#include "template/builtins.h"
#include "template/util.h"

namespace longctx::jinja {

Value get_attribute(const Value& object, const std::string& attr) {
  object.require_defined();
  // Jinja's `d.items` is Python's getattr first: the dict method wins over a key of that name
  // (a JSON schema's "items" key is reached with d['items']).
  if (object.is_mapping() &&
      (attr == "items" || attr == "keys" || attr == "values" || attr == "get"))
    return Value::function("dict." + attr, [object, attr](const CallArgs& a) {
      return *call_method(object, attr, a);
    });
  if (object.is_object()) {
    if (const Value* v = object.as_object().find(attr)) return *v;
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute '" + attr + "'");
}

Value get_item(const Value& object, const Value& index) {
  object.require_defined();
  index.require_defined();
  if ((object.is_array() || object.is_string()) && (index.is_int() || index.is_bool())) {
    int64_t i = index.as_int();
    if (object.is_array()) {
      const Array& items = object.as_array();
      int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
    } else {
      std::u32string s = utf8_decode(object.as_string());
      int64_t n = static_cast<int64_t>(s.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(utf8_encode(s.substr(static_cast<size_t>(i), 1)));
    }
    return Value::undefined(object.type_name() + " object has no element " +
                            std::to_string(index.as_int()));
  }
  if (index.is_string()) {  // d['k'] is the key first, then the attribute
    if (object.is_object())
      if (const Value* v = object.as_object().find(index.as_string())) return *v;
    return get_attribute(object, index.as_string());
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute " + index.repr());
}

Value slice(const Value& object, const Value* start, const Value* stop, const Value* step) {
  object.require_defined();
  auto bound = [](const Value* v) -> std::optional<int64_t> {
    if (!v || v->is_none()) return std::nullopt;
    if (!v->is_int() && !v->is_bool()) fail("slice indices must be integers or None");
    return v->as_int();
  };
  int64_t st = bound(step).value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  std::u32string chars;
  const Array* items = nullptr;
  if (object.is_string())
    chars = utf8_decode(object.as_string());
  else if (object.is_array())
    items = &object.as_array();
  else  // Jinja compiles slices to a plain Python subscript, so this raises
    fail("'" + object.type_name() + "' object is not subscriptable");
  int64_t n = items ? static_cast<int64_t>(items->size()) : static_cast<int64_t>(chars.size());
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + n : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t lo = clamp(bound(start), st > 0 ? 0 : n - 1);
  int64_t hi = clamp(bound(stop), st > 0 ? n : -1);
  // Count the picked indices first: stepping `i += st` past the end overflows for a step near
  // INT64_MAX. lo and hi lie in [-1, n], so the differences cannot overflow.
  const uint64_t span = st > 0 ? (hi > lo ? static_cast<uint64_t>(hi - lo) : 0)
                               : (lo > hi ? static_cast<uint64_t>(lo - hi) : 0);
  const uint64_t stride = st > 0 ? static_cast<uint64_t>(st) : 0 - static_cast<uint64_t>(st);
  const uint64_t count = span == 0 ? 0 : (span - 1) / stride + 1;
  charge_steps(static_cast<int64_t>(count));
  Array out_items;
  std::u32string out_chars;
  for (uint64_t k = 0; k < count; ++k) {
    // k * stride <= span - 1 < n, so the index stays inside [0, n).
    const auto off = static_cast<int64_t>(k * stride);
    const int64_t i = st > 0 ? lo + off : lo - off;
    if (items)
      out_items.push_back((*items)[static_cast<size_t>(i)]);
    else
      out_chars += chars[static_cast<size_t>(i)];
  }
  if (items) return Value::array(std::move(out_items), object.is_tuple());
  return Value(utf8_encode(out_chars));
}

namespace {

// b != 0. INT64_MIN / -1 overflows (and traps on x86), so -1 is negation, checked.
int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) {
    if (a == INT64_MIN) fail("integer overflow in //");
    return -a;
  }
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() +
       "'");
}

// Python ints are unbounded; ours are int64, so overflow is an error rather than a wrap.
template <typename Op>
Value checked(int64_t a, int64_t b, Op op) {
  int64_t r;
  if (op(a, b, &r)) fail("integer overflow");
  return Value(r);
}

Value repeat(const Value& seq, int64_t times) {
  // Charged before building: `'a' * 10**10` must fail at once, not after allocating 10 GB.
  const uint64_t unit =
      seq.is_string() ? seq.as_string().size() : seq.as_array().size() * sizeof(Value);
  uint64_t total = 0;
  if (times > 0 && __builtin_mul_overflow(unit, static_cast<uint64_t>(times), &total))
    fail("repetition too large");
  charge_bytes(total);
  if (total == 0) times = 0;  // '' * 10**18 is '', without 10**18 empty appends
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return Value(out);
  }
  Array out;
  for (int64_t i = 0; i < times; ++i)
    out.insert(out.end(), seq.as_array().begin(), seq.as_array().end());
  return Value::array(std::move(out), seq.is_tuple());
}

// Exponentiation by squaring: `1 ** INT64_MAX` must not loop INT64_MAX times.
int64_t int_pow(int64_t base, int64_t exp) {
  if (base == 0) return exp == 0 ? 1 : 0;
  if (base == 1) return 1;
  if (base == -1) return exp % 2 == 0 ? 1 : -1;
  int64_t r = 1;
  while (exp > 0) {
    if ((exp & 1) && __builtin_mul_overflow(r, base, &r)) fail("integer overflow in **");
    exp >>= 1;
    // |base| >= 2 and |r| >= 1: once the square overflows, any further factor overflows too.
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow in **");
  }
  return r;
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  a.require_defined();
  b.require_defined();
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints)
      return checked(a.as_int(), b.as_int(), [](int64_t x, int64_t y, int64_t* r) {
        return __builtin_add_overflow(x, y, r);
      });
    if (nums) return Value(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      charge_bytes(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
      charge_bytes((a.as_array().size() + b.as_array().size()) * sizeof(Value));
      Array out = a.as_array();
      out.insert(out.end(), b.as_array().begin(), b.as_array().end());
      return Value::array(std::move(out), a.is_tuple());
    }
  } else if (op == "-") {
    if (ints)
      return checked(a.as_int(), b.as_int(), [](int64_t x, int64_t y, int64_t* r) {
        return __builtin_sub_overflow(x, y, r);
      });
    if (nums) return Value(a.as_float() - b.as_float());
  } else if (op == "*") {
    if (ints)
      return checked(a.as_int(), b.as_int(), [](int64_t x, int64_t y, int64_t* r) {
        return __builtin_mul_overflow(x, y, r);
      });
    if (nums) return Value(a.as_float() * b.as_float());
    if ((a.is_string() || a.is_array()) && (b.is_int() || b.is_bool()))
      return repeat(a, b.as_int());
    if ((b.is_string() || b.is_array()) && (a.is_int() || a.is_bool()))
      return repeat(b, a.as_int());
  } else if (op == "/" || op == "//" || op == "%") {
    if (nums && b.as_float() == 0) fail(op == "%" ? "modulo by zero" : "division by zero");
    if (op == "/" && nums) return Value(a.as_float() / b.as_float());
    if (op == "//" && ints) return Value(floor_div(a.as_int(), b.as_int()));
    if (op == "//" && nums) return Value(std::floor(a.as_float() / b.as_float()));
    if (op == "%" && ints) {
      if (b.as_int() == -1) return Value(int64_t{0});  // INT64_MIN % -1 traps in C++
      return Value(a.as_int() - floor_div(a.as_int(), b.as_int()) * b.as_int());
    }
    if (op == "%" && nums) {
      double r = std::fmod(a.as_float(), b.as_float());
      if (r != 0 && ((r < 0) != (b.as_float() < 0))) r += b.as_float();
      return Value(r);
    }
    if (op == "%" && a.is_string())
      return Value(percent_format(a.as_string(), b.is_tuple() ? b.as_array() : Array{b}));
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) return Value(int_pow(a.as_int(), b.as_int()));
    if (nums) return Value(std::pow(a.as_float(), b.as_float()));
  }
  bad_operands(op, a, b);
}

namespace {

Value str_split(const std::string& s, const Value* sep_v, const Value* max_v, bool from_right) {
  int64_t maxsplit = (max_v && !max_v->is_none()) ? max_v->as_int() : -1;
  Array parts;
  if (!sep_v || sep_v->is_none()) {  // runs of whitespace, no empty strings
    std::u32string u = utf8_decode(s);
    if (from_right) std::reverse(u.begin(), u.end());
    size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && is_py_space(u[i])) ++i;
      if (i >= u.size()) break;
      size_t j = i;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        j = u.size();
        while (j > i && is_py_space(u[j - 1])) --j;
      } else {
        while (j < u.size() && !is_py_space(u[j])) ++j;
      }
      std::u32string piece = u.substr(i, j - i);
      if (from_right) std::reverse(piece.begin(), piece.end());
      parts.emplace_back(utf8_encode(piece));
      i = j;
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
    return Value::array(std::move(parts));
  }
  const std::string& sep = sep_v->as_string();
  if (sep.empty()) fail("empty separator");
  if (from_right) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t p = end >= sep.size() ? s.rfind(sep, end - sep.size()) : std::string::npos;
      if (p == std::string::npos) break;
      parts.insert(parts.begin(), Value(s.substr(p + sep.size(), end - p - sep.size())));
      end = p;
    }
    parts.insert(parts.begin(), Value(s.substr(0, end)));
    return Value::array(std::move(parts));
  }
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    size_t p = s.find(sep, start);
    if (p == std::string::npos) break;
    parts.emplace_back(s.substr(start, p - start));
    start = p + sep.size();
  }
  parts.emplace_back(s.substr(start));
  return Value::array(std::move(parts));
}

// Python str.format with {}, {0} and {name} fields (format specs are not supported).
std::string str_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if ((c == '{' || c == '}') && i + 1 < fmt.size() && fmt[i + 1] == c) {
      out += c;
      ++i;
    } else if (c == '{') {
      size_t close = fmt.find('}', i);
      if (close == std::string::npos) fail("single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!") != std::string::npos)
        fail("str.format: format specs are not supported ('" + field + "')");
      const Value* v = nullptr;
      if (field.empty())
        v = args.get(auto_index++, "\x01");
      else if (std::all_of(field.begin(), field.end(), ::isdigit))  // stoul throws on overflow
        v = field.size() < 10 ? args.get(std::stoul(field), "\x01") : nullptr;
      else
        v = args.get(SIZE_MAX, field);
      if (!v) fail("str.format: no argument for field '{" + field + "}'");
      std::string text = v->str();
      charge_bytes(text.size());  // "{0}{0}{0}..." repeats one argument many times
      out += text;
      i = close;
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<Value> string_method(const std::string& s, const std::string& name,
                                   const CallArgs& a) {
  const Value* a0 = a.get(0, "");
  const Value* a1 = a.get(1, "");
  auto need_str = [&](const Value* v, const char* what) -> const std::string& {
    if (!v || !v->is_string()) fail("str." + name + "() expects a string " + what);
    return v->as_string();
  };
  if (name == "startswith" || name == "endswith") {
    if (!a0) fail("str." + name + "() takes at least 1 argument");
    Array options = a0->is_tuple() ? a0->as_array() : Array{*a0};
    for (const Value& o : options) {
      const std::string& p = need_str(&o, "or tuple of strings");
      bool hit = name == "startswith"
                     ? s.compare(0, p.size(), p) == 0
                     : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
      if (hit) return Value(true);
    }
    return Value(false);
  }
  if (name == "split" || name == "rsplit")
    return str_split(s, a.get(0, "sep"), a.get(1, "maxsplit"), name == "rsplit");
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = a.get(0, "chars");
    return Value(py_strip(s, chars && !chars->is_none() ? &need_str(chars, "") : nullptr,
                          name != "rstrip", name != "lstrip"));
  }
  if (name == "replace") {
    const Value* count = a.get(2, "count");
    return Value(
        py_replace(s, need_str(a0, "(old)"), need_str(a1, "(new)"), count ? count->as_int() : -1));
  }
  if (name == "upper") return Value(str_upper(s));
  if (name == "lower") return Value(str_lower(s));
  if (name == "title") return Value(py_str_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "format") return Value(str_format(s, a));
  if (name == "join") {
    std::string out;
    Array items = iterate(a0 ? *a0 : Value());
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string& item = need_str(&items[i], "item");
      charge_bytes(item.size() + (i ? s.size() : 0));  // the separator repeats per item
      out += (i ? s : "") + item;
    }
    return Value(out);
  }
  if (name == "find" || name == "count") {
    const std::string& sub = need_str(a0, "");
    if (name == "find") {
      size_t p = s.find(sub);
      return Value(p == std::string::npos
                       ? int64_t{-1}
                       : static_cast<int64_t>(utf8_decode(s.substr(0, p)).size()));
    }
    if (sub.empty()) return Value(length(Value(s)) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value(n);
  }
  if (name == "removeprefix")
    return Value(s.compare(0, need_str(a0, "").size(), a0->as_string()) == 0
                     ? s.substr(a0->as_string().size())
                     : s);
  if (name == "removesuffix") {
    const std::string& x = need_str(a0, "");
    bool hit = s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value(hit ? s.substr(0, s.size() - x.size()) : s);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace") {
    if (s.empty()) return Value(false);
    std::u32string u = utf8_decode(s);
    return Value(std::all_of(u.begin(), u.end(), [&](char32_t c) {
      if (name == "isspace") return is_py_space(c);
      bool digit = c >= '0' && c <= '9', alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      return name == "isdigit" ? digit : name == "isalpha" ? alpha : digit || alpha;
    }));
  }
  if (name == "islower") return Value(str_lower(s) == s && str_upper(s) != s);
  if (name == "isupper") return Value(str_upper(s) == s && str_lower(s) != s);
  if (name == "splitlines") {
    Array lines;
    size_t start = 0;
    for (size_t p = s.find('\n'); p != std::string::npos; p = s.find('\n', start)) {
      lines.emplace_back(s.substr(start, p - start));
      start = p + 1;
    }
    if (start < s.size()) lines.emplace_back(s.substr(start));
    return Value::array(std::move(lines));
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> call_method(const Value& object, const std::string& name,
                                 const CallArgs& args) {
  if (object.is_string()) return string_method(object.as_string(), name, args);
  if (object.is_mapping()) {
    const Object& obj = object.as_object();
    if (name == "get") {
      const Value* key = args.get(0, "key");
      if (!key) fail("dict.get() takes at least 1 argument");
      const Value* dflt = args.get(1, "default");
      const Value* v = key->is_string() ? obj.find(key->as_string()) : nullptr;
      return v ? *v : dflt ? *dflt : Value(nullptr);
    }
    if (name == "items" || name == "keys" || name == "values") {
      Array out;
      for (const auto& [k, v] : obj.entries) {
        if (name == "items")
          out.push_back(Value::array({Value(k), v}, true));
        else
          out.push_back(name == "keys" ? Value(k) : v);
      }
      return Value::array(std::move(out));
    }
  }
  if (object.is_array()) {
    const Value* x = args.get(0, "value");
    if (name == "index" && x) {
      const Array& items = object.as_array();
      for (size_t i = 0; i < items.size(); ++i)
        if (equals(items[i], *x)) return Value(static_cast<int64_t>(i));
      fail(x->repr() + " is not in list");
    }
    if (name == "count" && x) {
      int64_t n = 0;
      for (const Value& v : object.as_array()) n += equals(v, *x);
      return Value(n);
    }
    if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
        name == "remove" || name == "clear" || name == "sort" || name == "reverse")
      fail("access to attribute '" + name + "' of 'list' object is unsafe (lists are immutable)");
  }
  return std::nullopt;
}

Object make_globals() {
  Object g;
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
          const Value* msg = a.get(0, "message");
          throw TemplateRaised(msg ? msg->str() : "");
        }));
  auto make_dict = [](const CallArgs& a, bool is_namespace) {
    Object obj;
    obj.is_namespace = is_namespace;
    for (const Value& p : a.positional) {
      if (!p.is_mapping()) fail("namespace()/dict() positional argument must be a mapping");
      for (const auto& [k, v] : p.as_object().entries) obj.set(k, v);
    }
    for (const auto& [k, v] : a.keyword) obj.set(k, v);
    return Value::object(std::move(obj));
  };
  g.set("namespace", Value::function("namespace", [make_dict](const CallArgs& a) {
          return make_dict(a, true);
        }));
  g.set("dict",
        Value::function("dict", [make_dict](const CallArgs& a) { return make_dict(a, false); }));
  g.set("range", Value::function("range", [](const CallArgs& a) {
          std::vector<int64_t> n;
          for (const Value& v : a.positional) {
            if (!v.is_int() && !v.is_bool()) fail("range() arguments must be integers");
            n.push_back(v.as_int());
          }
          if (n.empty() || n.size() > 3) fail("range() takes 1 to 3 arguments");
          int64_t start = n.size() > 1 ? n[0] : 0, stop = n.size() > 1 ? n[1] : n[0];
          int64_t step = n.size() > 2 ? n[2] : 1;
          if (step == 0) fail("range() arg 3 must not be zero");
          // Counted first, in unsigned arithmetic: `i += step` overflows near INT64_MAX.
          const bool up = step > 0;
          const uint64_t span =
              up ? (stop > start ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) : 0)
                 : (start > stop ? static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) : 0);
          const uint64_t mag = up ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
          const uint64_t count = span == 0 ? 0 : (span - 1) / mag + 1;
          if (count > 100000) fail("range too big (the sandbox allows 100000 items)");
          Array out;
          for (uint64_t k = 0; k < count; ++k)
            out.emplace_back(
                static_cast<int64_t>(static_cast<uint64_t>(start) + (up ? k * mag : 0 - k * mag)));
          return Value::array(std::move(out));
        }));
  g.set("strftime_now", Value::function("strftime_now", [](const CallArgs& a) {
          const Value* f = a.get(0, "format");
          if (!f || !f->is_string()) fail("strftime_now() expects a format string");
          std::time_t now = std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          size_t n = std::strftime(buf, sizeof(buf), f->as_string().c_str(), &tm);
          return Value(std::string(buf, n));
        }));
  return g;
}

}  // namespace longctx::jinja
