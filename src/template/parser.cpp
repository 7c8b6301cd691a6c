// Recursive-descent parser following jinja2.parser's grammar and operator precedence:
// condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary -,+ < postfix
// (attribute, subscript, call) and filters/tests (which bind tighter than arithmetic).
#include <algorithm>
#include <cstdlib>

#include "template/ast.h"
#include "template/builtins.h"

namespace longctx::jinja {
namespace {

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::kEof:
      return "end of template";
    case Tok::kBlockEnd:
      return "'%}'";
    case Tok::kVarEnd:
      return "'}}'";
    case Tok::kBlockBegin:
      return "'{%'";
    case Tok::kVarBegin:
      return "'{{'";
    case Tok::kData:
      return "template text";
    case Tok::kString:
      return "a string";
    case Tok::kInt:
    case Tok::kFloat:
      return "number " + t.text;
    default:
      return "'" + t.text + "'";
  }
}

std::string quote_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? (i + 1 == names.size() ? " or '" : ", '") : "'") + names[i] + "'";
  return out;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Program run() {
    Program program;
    std::string unused;
    program.body = parse_body({}, "", 0, &unused);
    return program;
  }

 private:
  const Token& cur() const { return t_[pos_]; }
  const Token& peek() const { return t_[std::min(pos_ + 1, t_.size() - 1)]; }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::kName && cur().text == n; }
  bool skip_op(std::string_view op) { return is_op(op) ? (++pos_, true) : false; }
  bool skip_name(std::string_view n) { return is_name(n) ? (++pos_, true) : false; }

  [[noreturn]] void fail_here(const std::string& expected) {
    syntax_error(cur().line, cur().column, "expected " + expected + ", got " + describe(cur()));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_here("'" + std::string(op) + "'");
  }
  std::string expect_name(const char* what = "a name") {
    if (cur().type != Tok::kName) fail_here(what);
    return t_[pos_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) fail_here("'%}'");
    ++pos_;
  }
  // Counts one level of parser recursion for the guard's life. Every recursive path (blocks,
  // brackets, unary operators) passes through one of these.
  struct NestGuard {
    int& depth;
    ~NestGuard() { --depth; }
  };
  [[nodiscard]] NestGuard nest() {
    if (depth_ >= kMaxTemplateNesting)
      syntax_error(cur().line, cur().column,
                   "template nested too deeply (more than " + std::to_string(kMaxTemplateNesting) +
                       " levels of blocks, brackets or operators)");
    ++depth_;
    return NestGuard{depth_};
  }

  // Adds a child (may be null), keeping the tree height bounded: operator and filter chains are
  // parsed by loops but still build one tree level per link.
  void add(Expr& parent, ExprPtr child) {
    if (child) {
      parent.height = std::max(parent.height, child->height + 1);
      if (parent.height > kMaxTemplateNesting)
        syntax_error(parent.line, parent.column,
                     "expression nested too deeply (more than " +
                         std::to_string(kMaxTemplateNesting) +
                         " levels of operators, filters, attributes or brackets)");
    }
    parent.args.push_back(std::move(child));
  }
  void add_kwarg(Expr& parent, std::string key, ExprPtr value) {
    parent.height = std::max(parent.height, value->height + 1);
    if (parent.height > kMaxTemplateNesting)
      syntax_error(parent.line, parent.column, "expression nested too deeply");
    parent.kwargs.emplace_back(std::move(key), std::move(value));
  }

  ExprPtr node(ExprKind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }

  // Statements until one of `end_tags` (left in *matched, positioned after the tag name).
  Body parse_body(const std::vector<std::string>& end_tags, const std::string& opener,
                  int opener_line, std::string* matched) {
    NestGuard guard = nest();
    Body body;
    auto saved = expected_;
    expected_ = end_tags;
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (end_tags.empty()) break;
        syntax_error(t.line, t.column,
                     "unexpected end of template: expected " + quote_list(end_tags) +
                         " to close '" + opener + "' from line " + std::to_string(opener_line));
      }
      if (t.type == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        ++pos_;
      } else if (t.type == Tok::kVarBegin) {
        ++pos_;
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = t.line;
        s->expr = parse_tuple(true);
        if (cur().type != Tok::kVarEnd) fail_here("'}}'");
        ++pos_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        ++pos_;
        if (cur().type != Tok::kName) fail_here("a tag name after '{%'");
        if (std::find(end_tags.begin(), end_tags.end(), cur().text) != end_tags.end()) {
          *matched = t_[pos_++].text;
          break;
        }
        body.push_back(parse_statement());
      } else {
        fail_here("template text or a tag");
      }
    }
    expected_ = saved;
    return body;
  }

  std::unique_ptr<Stmt> parse_statement() {
    const Token& tag = cur();
    auto s = std::make_unique<Stmt>();
    s->line = tag.line;
    std::string name = tag.text;
    ++pos_;
    std::string m;
    if (name == "if") {
      s->kind = StmtKind::kIf;
      ExprPtr cond = parse_tuple(false);
      for (;;) {
        expect_block_end();
        Body body = parse_body({"elif", "else", "endif"}, "if", s->line, &m);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (m != "elif") break;
        cond = parse_tuple(false);
      }
      if (m == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, "if", s->line, &m);
      }
    } else if (name == "for") {
      s->kind = StmtKind::kFor;
      s->targets = parse_targets();
      if (!skip_name("in")) fail_here("'in'");
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->filter = parse_expression(true);
      if (is_name("recursive"))
        syntax_error(cur().line, cur().column, "recursive for-loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"endfor", "else"}, "for", s->line, &m);
      --loop_depth_;
      if (m == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, "for", s->line, &m);
      }
    } else if (name == "set") {
      s->targets = parse_targets();
      if (s->targets.size() == 1 && skip_op(".")) s->attr = expect_name("an attribute name");
      if (skip_op("=")) {
        s->kind = StmtKind::kSet;
        s->expr = parse_tuple(true);
      } else {
        if (s->targets.size() != 1 || !s->attr.empty()) fail_here("'='");
        s->kind = StmtKind::kSetBlock;
        expect_block_end();
        s->body = parse_body({"endset"}, "set", s->line, &m);
      }
    } else if (name == "macro") {
      s->kind = StmtKind::kMacro;
      s->name = expect_name("a macro name");
      expect_op("(");
      while (!is_op(")")) {
        std::string param = expect_name("a parameter name");
        ExprPtr def = skip_op("=") ? parse_expression(true) : nullptr;
        s->params.emplace_back(param, std::move(def));
        if (!skip_op(",")) break;
      }
      expect_op(")");
      expect_block_end();
      int saved_depth = loop_depth_;  // a loop around a macro definition is not its loop
      loop_depth_ = 0;
      s->body = parse_body({"endmacro"}, "macro", s->line, &m);
      loop_depth_ = saved_depth;
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0)
        syntax_error(tag.line, tag.column, "'" + name + "' outside of a for-loop");
      s->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    } else if (name == "generation") {
      s->kind = StmtKind::kScope;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, "generation", s->line, &m);
    } else {
      std::string msg = "unknown tag '" + name + "'";
      if (!expected_.empty())
        msg += " (the innermost open block expects " + quote_list(expected_) + ")";
      syntax_error(tag.line, tag.column, msg);
    }
    expect_block_end();
    return s;
  }

  // Loop / assignment targets: `a`, `a, b` or `(a, b)`.
  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    do {
      if (paren && is_op(")")) break;
      names.push_back(expect_name("a variable name"));
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  bool tuple_ends() const {
    return cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || is_op(")") || is_op("]") ||
           is_name("in") || is_name("if") || is_name("else") || is_name("recursive");
  }

  ExprPtr parse_tuple(bool with_condexpr) {
    const Token& start = cur();
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    ExprPtr tuple = node(ExprKind::kTuple, start);
    add(*tuple, std::move(first));
    while (skip_op(",") && !tuple_ends()) add(*tuple, parse_expression(with_condexpr));
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    NestGuard guard = nest();
    ExprPtr expr = parse_or();
    if (!with_condexpr) return expr;
    while (is_name("if")) {
      ExprPtr cond = node(ExprKind::kCond, cur());
      ++pos_;
      ExprPtr test = parse_or();
      ExprPtr other = skip_name("else") ? parse_expression(true) : nullptr;
      add(*cond, std::move(expr));
      add(*cond, std::move(test));
      add(*cond, std::move(other));
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(ExprKind kind, const Token& at, ExprPtr a, ExprPtr b, std::string op = "") {
    ExprPtr e = node(kind, at);
    e->name = std::move(op);
    add(*e, std::move(a));
    add(*e, std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Token& at = t_[pos_++];
      left = binary(ExprKind::kOr, at, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Token& at = t_[pos_++];
      left = binary(ExprKind::kAnd, at, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    NestGuard guard = nest();
    ExprPtr e = node(ExprKind::kNot, t_[pos_++]);
    add(*e, parse_not());
    return e;
  }

  ExprPtr parse_compare() {
    const Token& start = cur();
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = t_[pos_++].text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprKind::kCompare, start);
        add(*cmp, std::move(first));
      }
      cmp->ops.push_back(op);
      add(*cmp, parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = t_[pos_++];
      left = binary(ExprKind::kBinary, at, std::move(left), parse_concat(), at.text);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token& at = t_[pos_++];
      left = binary(ExprKind::kConcat, at, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = t_[pos_++];
      left = binary(ExprKind::kBinary, at, std::move(left), parse_pow(), at.text);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& at = t_[pos_++];
      left = binary(ExprKind::kBinary, at, std::move(left), parse_unary(true), "**");
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      NestGuard guard = nest();
      e = node(is_op("-") ? ExprKind::kNeg : ExprKind::kPos, cur());
      ++pos_;
      add(*e, parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    ExprPtr e = node(ExprKind::kLiteral, t);
    switch (t.type) {
      case Tok::kName:
        ++pos_;
        if (t.text == "true" || t.text == "True")
          e->literal = Value(true);
        else if (t.text == "false" || t.text == "False")
          e->literal = Value(false);
        else if (t.text == "none" || t.text == "None")
          e->literal = Value(nullptr);
        else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        return e;
      case Tok::kString: {
        std::string s;
        while (cur().type == Tok::kString) s += t_[pos_++].text;  // "a" "b" is "ab"
        e->literal = Value(std::move(s));
        return e;
      }
      case Tok::kInt: {
        ++pos_;
        errno = 0;
        long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE)
          syntax_error(t.line, t.column, "integer literal out of range: " + t.text);
        e->literal = Value(static_cast<int64_t>(v));
        return e;
      }
      case Tok::kFloat:
        ++pos_;
        e->literal = Value(std::strtod(t.text.c_str(), nullptr));
        return e;
      default:
        break;
    }
    if (skip_op("(")) {
      if (skip_op(")")) {
        e->kind = ExprKind::kTuple;
        return e;
      }
      ExprPtr inner = parse_tuple(true);
      expect_op(")");
      return inner;
    }
    if (skip_op("[")) {
      e->kind = ExprKind::kList;
      while (!is_op("]")) {
        add(*e, parse_expression(true));
        if (!skip_op(",")) break;
      }
      expect_op("]");
      return e;
    }
    if (skip_op("{")) {
      e->kind = ExprKind::kDict;
      while (!is_op("}")) {
        add(*e, parse_expression(true));
        expect_op(":");
        add(*e, parse_expression(true));
        if (!skip_op(",")) break;
      }
      expect_op("}");
      return e;
    }
    fail_here("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const Token& at = cur();
      if (skip_op(".")) {
        if (cur().type == Tok::kInt) {  // x.0 is x[0]
          ExprPtr sub = node(ExprKind::kSubscript, at);
          add(*sub, std::move(e));
          add(*sub, parse_primary());
          e = std::move(sub);
        } else {
          ExprPtr attr = node(ExprKind::kAttr, at);
          attr->name = expect_name("an attribute name after '.'");
          add(*attr, std::move(e));
          e = std::move(attr);
        }
      } else if (skip_op("[")) {
        ExprPtr sub = node(ExprKind::kSubscript, at);
        add(*sub, std::move(e));
        add(*sub, parse_subscript());
        expect_op("]");
        e = std::move(sub);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript() {
    const Token& at = cur();
    ExprPtr start = is_op(":") ? nullptr : parse_expression(true);
    if (!skip_op(":")) return start;
    ExprPtr s = node(ExprKind::kSlice, at);
    add(*s, std::move(start));
    add(*s, is_op("]") || is_op(":") ? nullptr : parse_expression(true));
    add(*s, skip_op(":") && !is_op("]") ? parse_expression(true) : nullptr);
    return s;
  }

  // Parses `(args, name=value)` into `e` (positional after args already present).
  void parse_call_args(Expr* e) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = t_[pos_].text;
        pos_ += 2;
        add_kwarg(*e, key, parse_expression(true));
      } else {
        if (!e->kwargs.empty()) fail_here("a keyword argument (positional after keyword)");
        add(*e, parse_expression(true));
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr call = node(ExprKind::kCall, cur());
    add(*call, std::move(callee));
    parse_call_args(call.get());
    return call;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++pos_;
        const Token& name = cur();
        ExprPtr f = node(ExprKind::kFilter, name);
        f->name = expect_name("a filter name");
        if (!has_filter(f->name))
          syntax_error(name.line, name.column, "no filter named '" + f->name + "'");
        add(*f, std::move(e));
        if (is_op("(")) parse_call_args(f.get());
        e = std::move(f);
      } else if (is_name("is")) {
        ++pos_;
        bool negated = skip_name("not");
        const Token& name = cur();
        ExprPtr test = node(ExprKind::kTest, name);
        test->negated = negated;
        test->name = expect_name("a test name");
        if (!has_test(test->name))
          syntax_error(name.line, name.column, "no test named '" + test->name + "'");
        add(*test, std::move(e));
        Tok ty = cur().type;
        if (is_op("(")) {
          parse_call_args(test.get());
        } else if ((ty == Tok::kName || ty == Tok::kString || ty == Tok::kInt ||
                    ty == Tok::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail_here("an argument (tests cannot be chained)");
          add(*test, parse_postfix(parse_primary()));
        }
        e = std::move(test);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;  // current recursion depth (see nest())  // for-loops around the current position
                   // (break/continue need one)
  std::vector<std::string> expected_;
};

}  // namespace

Program parse_program(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace longctx::jinja
