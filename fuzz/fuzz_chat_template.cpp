// Chat-template parse + render: the template is the input (templates ship inside downloaded
// checkpoints), rendered with a conversation that exercises the common template paths. The
// render budget is lowered so that no single input runs past libFuzzer's 1 s timeout.
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "template/ast.h"
#include "template/renderer.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "What is 2+2? <think>"},
      {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4",
       "tool_calls": [{"type": "function",
                       "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
      {"role": "tool", "content": "{\"result\": 4}"},
      {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "add", "description": "adds",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "documents": null,
    "add_generation_prompt": true,
    "enable_thinking": false,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace longctx;
  static const jinja::Value ctx = jinja::from_json(context());
  fuzz::expect_clean([&] {
    jinja::Program program =
        jinja::parse_program(jinja::tokenize(std::string(fuzz::as_text(data, size))));
    jinja::RenderLimits limits;
    limits.max_steps = 200'000;
    limits.max_bytes = 32 << 20;
    jinja::Renderer(program, ctx, limits).render();
  });
  return 0;
}
