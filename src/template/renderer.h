// The tree-walking evaluator of a parsed chat template.
#pragma once

#include <string>
#include <vector>

#include "template/ast.h"

namespace longctx::jinja {

class Renderer {
 public:
  // `context` must be a mapping: the template's variables (messages, add_generation_prompt, ...).
  Renderer(const Program& program, const Value& context, const RenderLimits& limits = {});
  std::string render();

 private:
  struct Frame;
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_body(const Body& body, Frame& frame, std::string& out);
  Flow exec(const Stmt& s, Frame& frame, std::string& out);
  Flow exec_unlocated(const Stmt& s, Frame& frame, std::string& out);
  Flow exec_for(const Stmt& s, Frame& frame, std::string& out);
  void bind(Frame& frame, const std::vector<std::string>& targets, const Value& v);
  Value call_macro(const Stmt& macro, const CallArgs& args);
  Value lookup(const std::string& name, Frame& frame) const;
  Value eval(const Expr& e, Frame& frame);
  Value eval_call(const Expr& e, Frame& frame);
  CallArgs eval_args(const Expr& e, size_t first, Frame& frame);

  const Program& program_;
  RenderLimits limits_;
  Object globals_;
  Value context_;
  Frame* root_ = nullptr;
  int macro_depth_ = 0;
  // Below RenderLimits::max_depth / 4 (a macro level costs 2-4 nested evaluations), so that plain
  // runaway recursion is reported as such; real recursive macros (schemas) nest < 20 deep.
  static constexpr int kMaxMacroDepth = 128;
};

}  // namespace longctx::jinja
