// Tokens and the syntax tree of a parsed chat template. One generic node per expression and per
// statement (children in `args` / `body`, meaning by kind) keeps the interpreter compact.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/value.h"

namespace longctx::jinja {

enum class Tok {
  kData,
  kBlockBegin,
  kBlockEnd,
  kVarBegin,
  kVarEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // data text, name, operator, decoded string, or number digits
  int line = 1;
  int column = 1;
};

enum class ExprKind {
  kLiteral,    // literal
  kName,       // name
  kList,       // args: items
  kTuple,      // args: items
  kDict,       // args: key0, value0, key1, value1, ...
  kAttr,       // args[0].name
  kSubscript,  // args[0][args[1]]
  kSlice,      // args[0]:args[1]:args[2], each may be null
  kCall,       // args[0](args[1..], kwargs)
  kFilter,     // args[0] | name(args[1..], kwargs)
  kTest,       // args[0] is [not] name(args[1..], kwargs)
  kNeg,        // -args[0]
  kPos,        // +args[0]
  kNot,        // not args[0]
  kAnd,        // args[0] and args[1]
  kOr,         // args[0] or args[1]
  kConcat,     // args[0] ~ args[1]
  kBinary,     // args[0] name args[1] with name one of + - * / // % **
  kCompare,    // args[0] ops[0] args[1] ops[1] args[2] ...
  kCond,       // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// How deep blocks, brackets and operator chains may nest. The parser, the evaluator and the
// tree's destructor all recurse once per level; at a few hundred bytes of stack per level this
// keeps them far from the end of a thread's stack (20,000 nested `if`s did overflow it).
constexpr int kMaxTemplateNesting = 256;

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  int height = 1;  // levels of this subtree (a leaf is 1), at most kMaxTemplateNesting
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

enum class StmtKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches (cond, body)..., else_body
  kFor,       // for targets in expr [if filter]: body [else: else_body]
  kSet,       // set targets = expr, or set targets[0].attr = expr
  kSetBlock,  // set targets[0] %} body {% endset
  kMacro,     // macro name(params) body
  kBreak,
  kContinue,
  kScope,  // body rendered as is ({% generation %}, transformers' assistant-mask marker)
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;
  ExprPtr filter;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null (required)
};

struct Program {
  Body body;
};

// Splits a template into tokens, applying Jinja's whitespace control with transformers'
// settings (trim_blocks, lstrip_blocks, trailing newline dropped).
std::vector<Token> tokenize(const std::string& source);

// Parses tokens into a program; throws Error naming line, column and what was expected.
Program parse_program(const std::vector<Token>& tokens);

[[noreturn]] void syntax_error(int line, int column, const std::string& message);

}  // namespace longctx::jinja
