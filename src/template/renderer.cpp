// Evaluates a parsed template. Scoping follows Jinja: `set` writes to the innermost scope; each
// for-loop iteration and each macro call gets a fresh scope (so assignments inside a loop body
// are gone in the next iteration and after the loop), `if` blocks share their enclosing scope,
// and namespaces (`ns.attr = ...`) are the way to carry state out of a loop.
#include "template/renderer.h"

#include <algorithm>

#include "template/builtins.h"

namespace longctx::jinja {

struct Renderer::Frame {
  std::vector<std::pair<std::string, Value>> vars;
  Frame* parent = nullptr;

  void set(const std::string& name, Value v) {
    for (auto& [k, val] : vars) {
      if (k == name) {
        val = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

Renderer::Renderer(const Program& program, const Value& context, const RenderLimits& limits)
    : program_(program), limits_(limits), globals_(make_globals()) {
  if (!context.is_mapping()) fail("the template context must be a JSON object");
  context_ = context;
}

std::string Renderer::render() {
  Frame root;
  for (const auto& [k, v] : context_.as_object().entries) root.set(k, v);
  root_ = &root;
  BudgetScope budget(limits_);
  std::string out;
  exec_body(program_.body, root, out);
  root_ = nullptr;
  return out;
}

Value Renderer::lookup(const std::string& name, Frame& frame) const {
  for (Frame* f = &frame; f; f = f->parent)
    for (const auto& [k, v] : f->vars)
      if (k == name) return v;
  if (const Value* g = globals_.find(name)) return *g;
  return Value::undefined("'" + name + "' is undefined");
}

Renderer::Flow Renderer::exec_body(const Body& body, Frame& frame, std::string& out) {
  for (const auto& stmt : body) {
    Flow flow = exec(*stmt, frame, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::exec(const Stmt& s, Frame& frame, std::string& out) {
  BudgetScope::Nest nest;
  charge_steps(1);
  try {
    return exec_unlocated(s, frame, out);
  } catch (const RenderError& e) {
    if (e.line() != 0) throw;
    throw RenderError("chat template error at line " + std::to_string(s.line) + ": " + e.what(),
                      s.line);
  }
}

void Renderer::bind(Frame& frame, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    frame.set(targets[0], v);
    return;
  }
  Array items = iterate(v);
  if (items.size() != targets.size())
    fail("cannot unpack " + std::to_string(items.size()) + " values into " +
         std::to_string(targets.size()) + " names");
  for (size_t i = 0; i < targets.size(); ++i) frame.set(targets[i], items[i]);
}

Renderer::Flow Renderer::exec_unlocated(const Stmt& s, Frame& frame, std::string& out) {
  switch (s.kind) {
    case StmtKind::kText:
      charge_bytes(s.text.size());
      out += s.text;
      break;
    case StmtKind::kOutput: {
      Value v = eval(*s.expr, frame);
      const std::string text = v.is_string() ? v.as_string() : v.str();
      charge_bytes(text.size());  // the output is part of the memory budget
      out += text;
      break;
    }
    case StmtKind::kIf:
      for (const auto& [cond, body] : s.branches)
        if (eval(*cond, frame).truthy()) return exec_body(body, frame, out);
      return exec_body(s.else_body, frame, out);
    case StmtKind::kFor:
      return exec_for(s, frame, out);
    case StmtKind::kSet: {
      Value v = eval(*s.expr, frame);
      if (s.attr.empty()) {
        bind(frame, s.targets, v);
        break;
      }
      Value ns = lookup(s.targets[0], frame);
      if (!ns.is_namespace())
        fail("cannot assign attribute '" + s.attr + "' on non-namespace object '" + s.targets[0] +
             "'");
      // A namespace inside a namespace could hold itself (a cycle: endless printing, a leak).
      if (v.has_namespace())
        fail("cannot assign a namespace (or a value holding one) to attribute '" + s.attr +
             "' of namespace '" + s.targets[0] + "'");
      Object& obj = ns.mutable_object();
      if (v.depth() + 1 > kMaxValueDepth)
        fail("value nested too deeply (more than " + std::to_string(kMaxValueDepth) +
             " levels of lists and dicts)");
      obj.depth = std::max(obj.depth, v.depth() + 1);
      obj.set(s.attr, std::move(v));
      break;
    }
    case StmtKind::kSetBlock: {
      std::string captured;
      exec_body(s.body, frame, captured);
      frame.set(s.targets[0], Value(captured));
      break;
    }
    case StmtKind::kMacro: {
      const Stmt* macro = &s;
      frame.set(s.name, Value::function(s.name, [this, macro](const CallArgs& a) {
                  return call_macro(*macro, a);
                }));
      break;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kScope:
      return exec_body(s.body, frame, out);
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::exec_for(const Stmt& s, Frame& frame, std::string& out) {
  Value seq = eval(*s.expr, frame);
  if (seq.is_none()) fail("'NoneType' object is not iterable");
  Array items = iterate(seq);
  if (s.filter) {  // `for x in seq if cond`: loop.* counts only the kept items
    Array kept;
    for (const Value& item : items) {
      Frame scope{{}, &frame};
      bind(scope, s.targets, item);
      if (eval(*s.filter, scope).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(s.else_body, frame, out);
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    charge_steps(1);
    Frame scope{{}, &frame};
    bind(scope, s.targets, items[i]);
    Object loop;
    loop.set("index0", Value(i));
    loop.set("index", Value(i + 1));
    loop.set("revindex0", Value(n - i - 1));
    loop.set("revindex", Value(n - i));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == n - 1));
    loop.set("length", Value(n));
    loop.set("depth", Value(1));
    loop.set("depth0", Value(0));
    if (i > 0) loop.set("previtem", items[i - 1]);
    if (i + 1 < n) loop.set("nextitem", items[i + 1]);
    loop.set("cycle", Value::function("cycle", [i](const CallArgs& a) {
               if (a.positional.empty()) fail("loop.cycle() needs at least one argument");
               return a.positional[static_cast<size_t>(i) % a.positional.size()];
             }));
    scope.set("loop", Value::object(std::move(loop)));
    Flow flow = exec_body(s.body, scope, out);
    if (flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Value Renderer::call_macro(const Stmt& macro, const CallArgs& args) {
  if (!root_) fail("macro '" + macro.name + "' called outside of rendering");
  if (args.positional.size() > macro.params.size())
    fail("macro '" + macro.name + "' takes not more than " + std::to_string(macro.params.size()) +
         " argument(s)");
  // Recursive macros (e.g. JSON-schema-to-type helpers) are fine; runaway recursion is not.
  if (macro_depth_ >= kMaxMacroDepth) fail("macro '" + macro.name + "' recursed too deeply");
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& depth) : d(depth) { ++d; }
    ~DepthGuard() { --d; }
  } guard(macro_depth_);
  Frame scope{{}, root_};
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const auto& [name, dflt] = macro.params[i];
    if (const Value* v = args.get(i, name))
      scope.set(name, *v);
    else if (dflt)
      scope.set(name, eval(*dflt, scope));
    else
      scope.set(name, Value::undefined("parameter '" + name + "' was not provided"));
  }
  for (const auto& [k, _] : args.keyword) {
    bool known = false;
    for (const auto& p : macro.params) known = known || p.first == k;
    if (!known) fail("macro '" + macro.name + "' takes no keyword argument '" + k + "'");
  }
  std::string out;
  exec_body(macro.body, scope, out);
  return Value(out);
}

CallArgs Renderer::eval_args(const Expr& e, size_t first, Frame& frame) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], frame));
  for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v, frame));
  return a;
}

Value Renderer::eval_call(const Expr& e, Frame& frame) {
  const Expr& callee = *e.args[0];
  Value fn;
  if (callee.kind == ExprKind::kAttr) {  // obj.method(...): a str/dict/list method or a key
    Value obj = eval(*callee.args[0], frame);
    obj.require_defined();
    CallArgs args = eval_args(e, 1, frame);
    if (auto r = call_method(obj, callee.name, args)) return *r;
    fn = get_attribute(obj, callee.name);
    if (fn.is_undefined())
      fail("'" + obj.type_name() + "' object has no method '" + callee.name + "'");
    if (!fn.is_callable()) fail("'" + fn.type_name() + "' object is not callable");
    return fn.as_callable().fn(args);
  }
  fn = eval(callee, frame);
  fn.require_defined();
  if (!fn.is_callable()) fail("'" + fn.type_name() + "' object is not callable");
  return fn.as_callable().fn(eval_args(e, 1, frame));
}

Value Renderer::eval(const Expr& e, Frame& frame) {
  BudgetScope::Nest nest;
  charge_steps(1);
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName:
      return lookup(e.name, frame);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      Array items;
      for (const auto& a : e.args) items.push_back(eval(*a, frame));
      return Value::array(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      Object obj;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], frame);
        if (!k.is_string()) fail("dict keys must be strings, got " + k.type_name());
        obj.set(k.as_string(), eval(*e.args[i + 1], frame));
      }
      return Value::object(std::move(obj));
    }
    case ExprKind::kAttr:
      return get_attribute(eval(*e.args[0], frame), e.name);
    case ExprKind::kSubscript: {
      Value obj = eval(*e.args[0], frame);
      const Expr& idx = *e.args[1];
      if (idx.kind != ExprKind::kSlice) return get_item(obj, eval(idx, frame));
      Value bounds[3];
      const Value* ptrs[3] = {nullptr, nullptr, nullptr};
      for (int i = 0; i < 3; ++i) {
        if (!idx.args[i]) continue;
        bounds[i] = eval(*idx.args[i], frame);
        ptrs[i] = &bounds[i];
      }
      return slice(obj, ptrs[0], ptrs[1], ptrs[2]);
    }
    case ExprKind::kSlice:
      fail("a slice is only allowed inside [...]");
    case ExprKind::kCall:
      return eval_call(e, frame);
    case ExprKind::kFilter:
      return apply_filter(e.name, eval(*e.args[0], frame), eval_args(e, 1, frame));
    case ExprKind::kTest: {
      bool r = apply_test(e.name, eval(*e.args[0], frame), eval_args(e, 1, frame));
      return Value(r != e.negated);
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.args[0], frame);
      v.require_defined();
      if (!v.is_number())
        fail("bad operand type for unary " + std::string(e.kind == ExprKind::kNeg ? "-" : "+") +
             ": '" + v.type_name() + "'");
      if (e.kind == ExprKind::kPos) return v.is_float() ? v : Value(v.as_int());
      if (v.is_float()) return Value(-v.as_float());
      if (v.as_int() == INT64_MIN) fail("integer overflow in unary -");
      return Value(-v.as_int());
    }
    case ExprKind::kNot:
      return Value(!eval(*e.args[0], frame).truthy());
    case ExprKind::kAnd: {
      Value l = eval(*e.args[0], frame);
      return l.truthy() ? eval(*e.args[1], frame) : l;
    }
    case ExprKind::kOr: {
      Value l = eval(*e.args[0], frame);
      return l.truthy() ? l : eval(*e.args[1], frame);
    }
    case ExprKind::kConcat: {
      std::string left = eval(*e.args[0], frame).str();
      std::string right = eval(*e.args[1], frame).str();
      charge_bytes(left.size() + right.size());
      return Value(left + right);
    }
    case ExprKind::kBinary:
      return binary_op(e.name, eval(*e.args[0], frame), eval(*e.args[1], frame));
    case ExprKind::kCompare: {
      Value left = eval(*e.args[0], frame);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], frame);
        const std::string& op = e.ops[i];
        bool ok = op == "=="       ? equals(left, right)
                  : op == "!="     ? !equals(left, right)
                  : op == "in"     ? contains(right, left)
                  : op == "not in" ? !contains(right, left)
                  : op == "<"      ? compare(left, right) < 0
                  : op == "<="     ? compare(left, right) <= 0
                  : op == ">"      ? compare(left, right) > 0
                                   : compare(left, right) >= 0;
        if (!ok) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::kCond:
      if (eval(*e.args[1], frame).truthy()) return eval(*e.args[0], frame);
      if (e.args[2]) return eval(*e.args[2], frame);
      return Value::undefined(
          "the inline if-expression evaluated to false and no else section was defined");
  }
  fail("unknown expression kind");
}

}  // namespace longctx::jinja
