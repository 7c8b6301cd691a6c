// The dynamic value of the chat-template interpreter, modelled on the Python objects Jinja
// templates see: undefined, None, bool, int, float, str, list/tuple, dict (insertion-ordered),
// Jinja namespaces and callables. Lists and dicts are shared (copying a Value is cheap); only a
// namespace is ever mutated, as in transformers' ImmutableSandboxedEnvironment.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::jinja {

// A failure while rendering (type error, use of an undefined value, ...). The renderer adds the
// template line when the thrower did not know it.
class RenderError : public Error {
 public:
  explicit RenderError(const std::string& message, int line = 0)
      : Error(ErrorCode::kInvalidArgument, message), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

[[noreturn]] void fail(const std::string& message);

// Values nest at most this deep: deeper nesting (a JSON context, or `ns.x = [ns.x]` in a loop)
// would overflow the stack in the recursive printers, comparisons and destructors.
constexpr int kMaxValueDepth = 512;

// The work and memory limits of one render. A template is untrusted code: without limits
// `'a' * 10**10` allocates until the OOM killer comes and nested loops run for hours.
struct RenderLimits {
  // Nested evaluations (expressions, blocks, macro calls). An ASan build needs ~5 KB of stack
  // per level, a release build far less: 512 levels stay inside 4 MB either way.
  int max_depth = 512;
  int64_t max_steps = 20'000'000;        // expression evaluations, statements and element visits
  int64_t max_bytes = int64_t{1} << 30;  // bytes of strings and lists built, output included
};

// Charges the render running on this thread (a no-op outside a render): `bytes` about to be
// built, `steps` units of work; throws RenderError when the render's budget is spent.
void charge_bytes(uint64_t bytes);
void charge_steps(int64_t steps);

// Installs `limits` as this thread's render budget for its lifetime (renders may nest).
class BudgetScope {
 public:
  explicit BudgetScope(const RenderLimits& limits);
  ~BudgetScope();
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;
  // Counts one level of evaluation nesting for the scope's life; throws past max_depth.
  class Nest {
   public:
    Nest();
    ~Nest();
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;
  };

 private:
  friend void charge_bytes(uint64_t);
  friend void charge_steps(int64_t);
  RenderLimits limits_;
  int64_t steps_ = 0;
  uint64_t bytes_ = 0;
  int depth_ = 0;
  BudgetScope* previous_;
};

class Value;
using Array = std::vector<Value>;

struct ArrayBox {
  Array items;
  bool tuple = false;  // prints as (a, b) like a Python tuple
  int depth = 1;       // nesting depth of containers (see kMaxValueDepth)
  bool has_namespace = false;
};

// Insertion-ordered string-keyed dict (Python dicts keep insertion order, which tojson shows).
struct Object {
  std::vector<std::pair<std::string, Value>> entries;
  bool is_namespace = false;
  int depth = 1;               // filled in by Value::object (and namespace assignment)
  bool has_namespace = false;  // this object or a value inside it is a namespace
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The positional argument at index i or the keyword `name`, else nullptr.
  const Value* get(size_t i, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

struct Undefined {
  std::string hint;  // what an operation on it reports, e.g. "'foo' is undefined"
};

class Value {
 public:
  Value() : v_(Undefined{}) {}
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  // Strings are shared and immutable: templates copy message contents around a lot.
  Value(std::string s) {
    charge_bytes(s.size() + sizeof(std::string));
    v_ = std::make_shared<const std::string>(std::move(s));
  }
  Value(const char* s) : Value(std::string(s)) {}
  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value array(Array items, bool tuple = false);
  static Value object(Object object);
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // bool is an int
  bool is_string() const { return std::holds_alternative<std::shared_ptr<const std::string>>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<ArrayBox>>(v_); }
  bool is_tuple() const { return is_array() && array_box().tuple; }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_mapping() const { return is_object() && !as_object().is_namespace; }
  bool is_namespace() const { return is_object() && as_object().is_namespace; }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(v_); }
  // Container nesting depth (0 for scalars) and whether a namespace is inside (or is this).
  int depth() const;
  bool has_namespace() const;

  bool as_bool() const { return get<bool>("bool"); }
  // Typed access; a value of another type is a RenderError naming both types (not a crash).
  int64_t as_int() const;   // int or bool
  double as_float() const;  // any number
  const std::string& as_string() const { return *get<std::shared_ptr<const std::string>>("str"); }
  const Array& as_array() const { return array_box().items; }
  const ArrayBox& array_box() const { return *get<std::shared_ptr<ArrayBox>>("list"); }
  const Object& as_object() const { return *get<std::shared_ptr<Object>>("dict"); }
  Object& mutable_object() const { return *get<std::shared_ptr<Object>>("dict"); }
  const Callable& as_callable() const { return *get<std::shared_ptr<Callable>>("function"); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

  bool truthy() const;
  std::string str() const;   // Python str(); undefined -> ""
  std::string repr() const;  // Python repr()
  std::string type_name() const;
  // Throws the undefined value's hint; used where Jinja's Undefined raises.
  void require_defined() const;

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  [[noreturn]] void type_error(const char* expected) const;
  template <typename T>
  const T& get(const char* expected) const {
    if (!std::holds_alternative<T>(v_)) type_error(expected);
    return std::get<T>(v_);
  }
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<ArrayBox>, std::shared_ptr<Object>, std::shared_ptr<Callable>>
      v_;
};

bool equals(const Value& a, const Value& b);  // Python ==
int compare(const Value& a, const Value& b);  // Python <, ==, > as -1/0/1; throws if unorderable
bool contains(const Value& container, const Value& item);  // Python `item in container`
// The items a for-loop visits: list items, dict keys, string characters; undefined -> none.
Array iterate(const Value& v);
// Python len(): code points for strings; undefined -> 0.
int64_t length(const Value& v);

// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys); indent < 0 means None.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string indent_str;  // used instead of `indent` spaces when set (Python accepts a string)
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& options);

Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

std::string format_float(double d);  // Python repr(float)

// UTF-8 helpers: templates index and measure strings in code points, like Python.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
bool is_py_space(char32_t c);  // Python str.isspace()

}  // namespace longctx::jinja
