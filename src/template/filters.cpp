// Jinja's built-in filters and tests (jinja2/filters.py, jinja2/tests.py), with transformers'
// own `tojson` (json.dumps with ensure_ascii=False, optional indent/separators/sort_keys).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "template/builtins.h"
#include "template/util.h"

namespace longctx::jinja {
namespace {

using FilterFn = std::function<Value(const Value&, const CallArgs&)>;
using TestFn = std::function<bool(const Value&, const CallArgs&)>;

// Positional argument i or keyword `name` of a filter/test call, else `dflt`.
Value arg(const CallArgs& a, size_t i, std::string_view name, Value dflt = Value()) {
  const Value* v = a.get(i, name);
  return v ? *v : dflt;
}

CallArgs rest_args(const CallArgs& a, size_t from) {
  CallArgs r;
  if (from < a.positional.size())
    r.positional.assign(a.positional.begin() + from, a.positional.end());
  r.keyword = a.keyword;
  return r;
}

// `item.a.b` for map/selectattr/sort attribute=... (dotted paths and integer parts allowed).
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    // Up to 18 digits: std::stoll throws a non-Error exception on overflow.
    bool numeric =
        !part.empty() && part.size() <= 18 && std::all_of(part.begin(), part.end(), ::isdigit);
    v = numeric ? get_item(v, Value(static_cast<int64_t>(std::stoll(part))))
                : get_attribute(v, part);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

// Sort key for sort/min/max/unique/dictsort: strings lowered unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value(str_lower(v.as_string())) : v;
}

// float -> int64 truncating like Python's int(); out of range is an error, not undefined behavior.
int64_t float_to_int(double d) {
  if (std::isnan(d)) fail("cannot convert float NaN to integer");
  if (!(d > -9223372036854775808.0 - 1024 && d < 9223372036854775808.0))
    fail("integer overflow converting " + format_float(d) + " to int");
  return static_cast<int64_t>(d);
}

Value to_int(const Value& v, const Value& dflt, int base) {
  v.require_defined();  // int(Undefined) raises in Jinja
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return Value(float_to_int(v.as_float()));
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), nullptr, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty()) {
      size_t used = 0;
      try {
        long long r = std::stoll(s, &used, base);
        if (used == s.size()) return Value(static_cast<int64_t>(r));
      } catch (const std::exception&) {
      }
      double d = 0;
      try {
        d = std::stod(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == s.size() && std::isfinite(d)) return Value(float_to_int(d));
    }
  }
  return dflt;
}

Value to_float(const Value& v, const Value& dflt) {
  v.require_defined();
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), nullptr, true, true);
    size_t used = 0;
    try {
      double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

Value do_tojson(const Value& v, const CallArgs& a) {
  JsonOptions opt;
  opt.ensure_ascii = arg(a, 0, "ensure_ascii", Value(false)).truthy();
  Value indent = arg(a, 1, "indent", Value(nullptr));
  if (indent.is_string())
    opt.indent_str = indent.as_string();
  else if (indent.is_number())  // clamped to int; the memory budget stops a huge indent
    opt.indent = static_cast<int>(std::clamp<int64_t>(
        indent.is_float() ? float_to_int(indent.as_float()) : indent.as_int(), 0, INT32_MAX));
  Value seps = arg(a, 2, "separators", Value(nullptr));
  if (seps.is_array()) {
    if (seps.as_array().size() != 2 || !seps.as_array()[0].is_string() ||
        !seps.as_array()[1].is_string())
      fail("tojson: separators must be a pair of strings");
    opt.separators = std::make_pair(seps.as_array()[0].as_string(), seps.as_array()[1].as_string());
  }
  opt.sort_keys = arg(a, 3, "sort_keys", Value(false)).truthy();
  return Value(to_json(v, opt));
}

Value do_indent(const Value& v, const CallArgs& a) {
  Value width = arg(a, 0, "width", Value(4));
  if (!v.is_string()) fail("indent expects a string, got " + v.type_name());
  if (!width.is_string()) charge_bytes(static_cast<uint64_t>(std::max<int64_t>(0, width.as_int())));
  std::string ind =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  bool first = arg(a, 1, "first", Value(false)).truthy();
  bool blank = arg(a, 2, "blank", Value(false)).truthy();
  std::vector<std::string> lines;
  std::string s = v.str(), line;
  for (char c : s) {
    if (c == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += c;
    }
  }
  lines.push_back(line);  // Jinja appends "\n" before splitlines, so a trailing "" line is kept
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    charge_bytes(ind.size() + 1);  // the indent repeats on every line
    out += "\n" + ((blank || !lines[i].empty()) ? ind : "") + lines[i];
  }
  return Value(first ? ind + out : out);
}

Array select_items(const Value& seq, const CallArgs& a, bool by_attr, bool keep) {
  std::string attr;
  size_t test_pos = 0;
  if (by_attr) {
    Value at = arg(a, 0, "attribute");
    if (!at.is_string()) fail("selectattr/rejectattr needs an attribute name");
    attr = at.as_string();
    test_pos = 1;
  }
  Value test = arg(a, test_pos, "\x01");
  CallArgs targs = rest_args(a, test_pos + 1);
  if (!test.is_undefined() && !test.is_string()) fail("select: the test name must be a string");
  Array out;
  for (const Value& item : iterate(seq)) {
    Value subject = by_attr ? attribute_path(item, attr) : item;
    bool ok = test.is_undefined() ? subject.truthy() : apply_test(test.as_string(), subject, targs);
    if (ok == keep) out.push_back(item);
  }
  return out;
}

Value min_max(const Value& v, const CallArgs& a, bool want_max) {
  bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
  Value attr = arg(a, 1, "attribute", Value(nullptr));
  Array items = iterate(v);
  if (items.empty())
    return Value::undefined(std::string("No aggregated item, sequence was empty."));
  auto key = [&](const Value& x) {
    return sort_key(attr.is_string() ? attribute_path(x, attr.as_string()) : x, cs);
  };
  Value best = items[0], best_key = key(best);
  for (const Value& x : items) {
    Value k = key(x);
    int c = compare(k, best_key);
    if (want_max ? c > 0 : c < 0) best = x, best_key = std::move(k);
  }
  return best;
}

Value do_sort(const Value& v, const CallArgs& a) {
  bool reverse = arg(a, 0, "reverse", Value(false)).truthy();
  bool cs = arg(a, 1, "case_sensitive", Value(false)).truthy();
  Value attr = arg(a, 2, "attribute", Value(nullptr));
  Array items = iterate(v);
  auto key = [&](const Value& x) {
    return sort_key(attr.is_string() ? attribute_path(x, attr.as_string()) : x, cs);
  };
  // Keys once per item (lowering a string per comparison made sorts of long strings crawl).
  std::vector<std::pair<Value, size_t>> keyed;
  keyed.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    charge_steps(1);
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  Array out;
  out.reserve(items.size());
  for (const auto& [k, i] : keyed) out.push_back(std::move(items[i]));
  return Value::array(std::move(out));
}

Value do_map(const Value& v, const CallArgs& a) {
  Array out;
  Value attr = arg(a, SIZE_MAX, "attribute");
  if (attr.is_string()) {
    Value dflt = arg(a, SIZE_MAX, "default");
    for (const Value& item : iterate(v)) {
      Value x = attribute_path(item, attr.as_string());
      out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
    }
    return Value::array(std::move(out));
  }
  Value name = arg(a, 0, "\x01");
  if (!name.is_string()) fail("map needs a filter name or attribute=...");
  if (!has_filter(name.as_string())) fail("no filter named '" + name.as_string() + "'");
  CallArgs fargs = rest_args(a, 1);
  for (const Value& item : iterate(v)) out.push_back(apply_filter(name.as_string(), item, fargs));
  return Value::array(std::move(out));
}

// Python's round(x, n) of a float: the double nearest the exact value of x rounded to n decimal
// places, ties to even (CPython rounds the exact binary value through its dtoa; glibc's printf
// does the same).
double python_round(double x, int64_t n) {
  if (!std::isfinite(x) || x == 0) return x;
  // Past every digit a double has: x itself; before its first: a signed zero (as CPython).
  if (n > 323) return x;
  if (n < -308) return 0.0 * x;
  char buf[1024];  // 309 integer digits and 323 decimals at most
  if (n >= 0) {
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  // Rounding to 10^k (k = -n): keep the digits of x down to 10^k, as %e does with e - k of them
  // after the point (e: x's decimal exponent).
  std::snprintf(buf, sizeof buf, "%.17e", x);
  const int64_t e = std::strtol(std::strchr(buf, 'e') + 1, nullptr, 10);
  const int64_t k = -n;
  if (e - k >= 0) {
    std::snprintf(buf, sizeof buf, "%.*e", static_cast<int>(e - k), x);
    return std::strtod(buf, nullptr);
  }
  // |x| < 10^k: 0, or 10^k past the half (the half itself goes to 0, the even side).
  const double unit = std::pow(10.0, static_cast<double>(k));
  if (e - k == -1 && std::fabs(x) > unit / 2) return std::copysign(unit, x);
  return 0.0 * x;
}

// Python's round(i, n) of an int: i itself for n >= 0, else to a multiple of 10^-n, ties to even.
int64_t python_round_int(int64_t i, int64_t n) {
  if (n >= 0) return i;
  if (n < -18) return 0;  // 10^19 > every int64
  __int128 p = 1;
  for (int64_t d = 0; d < -n; ++d) p *= 10;
  const __int128 x = i;
  __int128 q = x / p, r = x % p;
  if (r < 0) {  // floor division, as Python's
    r += p;
    q -= 1;
  }
  if (2 * r > p || (2 * r == p && q % 2 != 0)) q += 1;
  const __int128 out = q * p;
  if (out > INT64_MAX || out < INT64_MIN) fail("round: the result does not fit a 64-bit integer");
  return static_cast<int64_t>(out);
}

// Jinja's round(value, precision=0, method='common'): 'common' is Python's round() (an int stays
// an int); 'ceil' and 'floor' are math.ceil/floor(value * 10**precision) / 10**precision, a
// float.
Value do_round(const Value& v, const CallArgs& a) {
  if (!v.is_number()) fail("round expects a number, got " + v.type_name());
  const Value p = arg(a, 0, "precision", Value(0));
  if (!p.is_int() && !p.is_bool())
    fail("round: precision must be an integer, got " + p.type_name());
  const int64_t precision = p.as_int();
  const Value m = arg(a, 1, "method", Value("common"));
  const std::string method = m.is_string() ? m.as_string() : std::string();
  if (method == "common") {
    if (!v.is_float()) return Value(python_round_int(v.as_int(), precision));
    return Value(python_round(v.as_float(), precision));
  }
  if (method != "ceil" && method != "floor") fail("round: method must be common, ceil or floor");
  // Python: an int times 10**precision stays exact, so ceil/floor of it is the int itself.
  if (!v.is_float() && precision >= 0) return Value(static_cast<double>(v.as_int()));
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (!std::isfinite(scale) || scale == 0)
    fail("round: precision " + std::to_string(precision) + " is out of range for method " + method);
  const double x = v.as_float() * scale;
  if (!std::isfinite(x)) fail("round: the value times 10**precision overflows");
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = [] {
    std::map<std::string, FilterFn, std::less<>> f;
    f["abs"] = [](const Value& v, const CallArgs&) {
      if (!v.is_number()) fail("bad operand type for abs(): '" + v.type_name() + "'");
      if (v.is_float()) return Value(std::fabs(v.as_float()));
      if (v.as_int() == INT64_MIN) fail("integer overflow in abs()");  // llabs is undefined
      return Value(static_cast<int64_t>(std::llabs(v.as_int())));
    };
    // getattr only: dict keys are not attributes, dict methods are.
    f["attr"] = [](const Value& v, const CallArgs& a) {
      std::string name = arg(a, 0, "name").str();
      Value r = get_attribute(v, name);
      if (v.is_mapping() && !r.is_callable())
        return Value::undefined("'dict object' has no attribute '" + name + "'");
      return r;
    };
    f["capitalize"] = [](const Value& v, const CallArgs&) { return Value(py_capitalize(v.str())); };
    f["length"] = [](const Value& v, const CallArgs&) { return Value(length(v)); };
    f["count"] = f["length"];
    f["default"] = [](const Value& v, const CallArgs& a) {
      bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
      return (v.is_undefined() || (boolean && !v.truthy())) ? arg(a, 0, "default_value", Value(""))
                                                            : v;
    };
    f["d"] = f["default"];
    f["dictsort"] = [](const Value& v, const CallArgs& a) {
      if (!v.is_mapping()) fail("dictsort expects a mapping, got " + v.type_name());
      bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
      int pos = arg(a, 1, "by", Value("key")).str() == "value" ? 1 : 0;
      bool reverse = arg(a, 2, "reverse", Value(false)).truthy();
      Array items = call_method(v, "items", {})->as_array();
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        int c = compare(sort_key(x.as_array()[pos], cs), sort_key(y.as_array()[pos], cs));
        return reverse ? c > 0 : c < 0;
      });
      return Value::array(std::move(items));
    };
    f["escape"] = [](const Value& v, const CallArgs&) {
      std::string out;
      for (char c : v.str()) {
        switch (c) {
          case '&':
            charge_bytes(5);
            out += "&amp;";
            break;
          case '<':
            charge_bytes(5);
            out += "&lt;";
            break;
          case '>':
            charge_bytes(5);
            out += "&gt;";
            break;
          case '"':
            charge_bytes(5);
            out += "&#34;";
            break;
          case '\'':
            charge_bytes(5);
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value(out);
    };
    f["e"] = f["escape"];
    f["first"] = [](const Value& v, const CallArgs&) {
      Array items = iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    f["last"] = [](const Value& v, const CallArgs&) {
      Array items = iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    f["float"] = [](const Value& v, const CallArgs& a) {
      return to_float(v, arg(a, 0, "default", Value(0.0)));
    };
    f["int"] = [](const Value& v, const CallArgs& a) {
      return to_int(v, arg(a, 0, "default", Value(0)),
                    static_cast<int>(arg(a, 1, "base", Value(10)).as_int()));
    };
    f["format"] = [](const Value& v, const CallArgs& a) {
      return Value(percent_format(v.str(), a.positional));
    };
    f["indent"] = do_indent;
    f["items"] = [](const Value& v, const CallArgs&) {
      if (v.is_undefined()) return Value::array({});
      if (!v.is_mapping()) fail("can only get item pairs from a mapping, not " + v.type_name());
      return *call_method(v, "items", {});
    };
    f["join"] = [](const Value& v, const CallArgs& a) {
      std::string sep = arg(a, 0, "d", Value("")).str(), out;
      Value attr = arg(a, 1, "attribute", Value(nullptr));
      Array items = iterate(v);
      for (size_t i = 0; i < items.size(); ++i) {
        std::string item =
            (attr.is_string() ? attribute_path(items[i], attr.as_string()) : items[i]).str();
        charge_bytes(item.size() + (i ? sep.size() : 0));  // the separator repeats per item
        out += (i ? sep : "") + item;
      }
      return Value(out);
    };
    f["list"] = [](const Value& v, const CallArgs&) { return Value::array(iterate(v)); };
    f["lower"] = [](const Value& v, const CallArgs&) { return Value(str_lower(v.str())); };
    f["upper"] = [](const Value& v, const CallArgs&) { return Value(str_upper(v.str())); };
    f["map"] = do_map;
    f["max"] = [](const Value& v, const CallArgs& a) { return min_max(v, a, true); };
    f["min"] = [](const Value& v, const CallArgs& a) { return min_max(v, a, false); };
    f["select"] = [](const Value& v, const CallArgs& a) {
      return Value::array(select_items(v, a, false, true));
    };
    f["reject"] = [](const Value& v, const CallArgs& a) {
      return Value::array(select_items(v, a, false, false));
    };
    f["selectattr"] = [](const Value& v, const CallArgs& a) {
      return Value::array(select_items(v, a, true, true));
    };
    f["rejectattr"] = [](const Value& v, const CallArgs& a) {
      return Value::array(select_items(v, a, true, false));
    };
    f["replace"] = [](const Value& v, const CallArgs& a) {
      Value count = arg(a, 2, "count", Value(nullptr));
      return Value(py_replace(v.str(), arg(a, 0, "old").str(), arg(a, 1, "new").str(),
                              count.is_none() ? -1 : count.as_int()));
    };
    f["reverse"] = [](const Value& v, const CallArgs&) {
      if (v.is_string()) {
        std::u32string u = utf8_decode(v.as_string());
        std::reverse(u.begin(), u.end());
        return Value(utf8_encode(u));
      }
      Array items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::array(std::move(items));
    };
    f["round"] = do_round;
    f["safe"] = [](const Value& v, const CallArgs&) { return v.is_string() ? v : Value(v.str()); };
    f["sort"] = do_sort;
    f["string"] = [](const Value& v, const CallArgs&) { return Value(v.str()); };
    f["sum"] = [](const Value& v, const CallArgs& a) {
      Value attr = arg(a, 0, "attribute", Value(nullptr));
      Value total = arg(a, 1, "start", Value(0));
      for (const Value& x : iterate(v))
        total = binary_op("+", total, attr.is_string() ? attribute_path(x, attr.as_string()) : x);
      return total;
    };
    f["title"] = [](const Value& v, const CallArgs&) { return Value(py_title(v.str())); };
    f["tojson"] = do_tojson;
    f["trim"] = [](const Value& v, const CallArgs& a) {
      Value chars = arg(a, 0, "chars", Value(nullptr));
      return Value(py_strip(v.str(), chars.is_string() ? &chars.as_string() : nullptr, true, true));
    };
    f["unique"] = [](const Value& v, const CallArgs& a) {
      bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
      Value attr = arg(a, 1, "attribute", Value(nullptr));
      Array out, seen;
      for (const Value& x : iterate(v)) {
        Value k = sort_key(attr.is_string() ? attribute_path(x, attr.as_string()) : x, cs);
        charge_steps(static_cast<int64_t>(seen.size()) + 1);  // quadratic in the items
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(x);
        }
      }
      return Value::array(std::move(out));
    };
    f["wordcount"] = [](const Value& v, const CallArgs&) {
      int64_t n = 0;
      bool in_word = false;
      for (char c : v.str()) {
        bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (c & 0x80);
        n += w && !in_word;
        in_word = w;
      }
      return Value(n);
    };
    return f;
  }();
  return table;
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = [] {
    std::map<std::string, TestFn, std::less<>> t;
    auto other = [](const CallArgs& a) { return arg(a, 0, "other"); };
    t["defined"] = [](const Value& v, const CallArgs&) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, const CallArgs&) { return v.is_undefined(); };
    t["none"] = [](const Value& v, const CallArgs&) { return v.is_none(); };
    t["boolean"] = [](const Value& v, const CallArgs&) { return v.is_bool(); };
    t["true"] = [](const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); };
    t["false"] = [](const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); };
    t["integer"] = [](const Value& v, const CallArgs&) { return v.is_int(); };
    t["float"] = [](const Value& v, const CallArgs&) { return v.is_float(); };
    t["number"] = [](const Value& v, const CallArgs&) { return v.is_number(); };
    t["string"] = [](const Value& v, const CallArgs&) { return v.is_string(); };
    t["mapping"] = [](const Value& v, const CallArgs&) { return v.is_mapping(); };
    // Python: iterable = has __iter__, sequence = has __len__ and __getitem__ (Undefined has both).
    t["iterable"] = [](const Value& v, const CallArgs&) {
      return v.is_undefined() || v.is_string() || v.is_array() || v.is_mapping();
    };
    t["sequence"] = t["iterable"];
    t["callable"] = [](const Value& v, const CallArgs&) {
      return v.is_callable() || v.is_undefined();
    };
    t["sameas"] = [other](const Value& v, const CallArgs& a) {
      Value o = other(a);
      if (v.is_bool() || o.is_bool())
        return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
      if (v.is_array() || v.is_object()) return equals(v, o) && v.type_name() == o.type_name();
      return v.type_name() == o.type_name() && equals(v, o);
    };
    t["eq"] = [other](const Value& v, const CallArgs& a) { return equals(v, other(a)); };
    t["ne"] = [other](const Value& v, const CallArgs& a) { return !equals(v, other(a)); };
    t["lt"] = [other](const Value& v, const CallArgs& a) { return compare(v, other(a)) < 0; };
    t["le"] = [other](const Value& v, const CallArgs& a) { return compare(v, other(a)) <= 0; };
    t["gt"] = [other](const Value& v, const CallArgs& a) { return compare(v, other(a)) > 0; };
    t["ge"] = [other](const Value& v, const CallArgs& a) { return compare(v, other(a)) >= 0; };
    t["equalto"] = t["=="] = t["eq"];
    t["!="] = t["ne"];
    t["lessthan"] = t["<"] = t["lt"];
    t["<="] = t["le"];
    t["greaterthan"] = t[">"] = t["gt"];
    t[">="] = t["ge"];
    t["in"] = [](const Value& v, const CallArgs& a) { return contains(arg(a, 0, "seq"), v); };
    // Jinja: value % 2 == 1 etc., so floats work and strings fail (%-formatting).
    auto mod_is = [](const Value& v, const Value& n, int64_t want) {
      return equals(binary_op("%", v, n), Value(want));
    };
    t["odd"] = [mod_is](const Value& v, const CallArgs&) { return mod_is(v, Value(2), 1); };
    t["even"] = [mod_is](const Value& v, const CallArgs&) { return mod_is(v, Value(2), 0); };
    t["divisibleby"] = [mod_is](const Value& v, const CallArgs& a) {
      return mod_is(v, arg(a, 0, "num"), 0);
    };
    t["lower"] = [](const Value& v, const CallArgs&) {
      return call_method(Value(v.str()), "islower", {})->truthy();  // str(value).islower()
    };
    t["upper"] = [](const Value& v, const CallArgs&) {
      return call_method(Value(v.str()), "isupper", {})->truthy();
    };
    t["filter"] = [](const Value& v, const CallArgs&) {
      return v.is_string() && has_filter(v.as_string());
    };
    t["test"] = [](const Value& v, const CallArgs&) {
      return v.is_string() && has_test(v.as_string());
    };
    t["escaped"] = [](const Value&, const CallArgs&) { return false; };
    return t;
  }();
  return table;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) > 0; }
bool has_test(std::string_view name) { return tests().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("no filter named '" + name + "'");
  return it->second(subject, args);
}

bool apply_test(const std::string& name, const Value& subject, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("no test named '" + name + "'");
  return it->second(subject, args);
}

}  // namespace longctx::jinja
