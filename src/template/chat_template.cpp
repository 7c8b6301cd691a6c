#include "longctx/template/chat_template.h"

#include "template/ast.h"
#include "template/renderer.h"

namespace longctx {

ChatTemplate ChatTemplate::parse(std::string source) {
  ChatTemplate t;
  auto program = std::make_shared<jinja::Program>(jinja::parse_program(jinja::tokenize(source)));
  t.program_ = std::move(program);
  t.source_ = std::make_shared<const std::string>(std::move(source));
  return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  LONGCTX_CHECK(program_, ErrorCode::kInvalidArgument,
                "empty ChatTemplate: use ChatTemplate::parse");
  return jinja::Renderer(*program_, jinja::from_json(context)).render();
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  LONGCTX_CHECK(program_, ErrorCode::kInvalidArgument,
                "empty ChatTemplate: use ChatTemplate::parse");
  return jinja::Renderer(*program_, jinja::from_json(context)).render();
}

const std::string& ChatTemplate::source() const {
  static const std::string kEmpty;
  return source_ ? *source_ : kEmpty;
}

std::string chat_template_source(const nlohmann::ordered_json& config) {
  LONGCTX_CHECK(config.is_object(), ErrorCode::kInvalidArgument,
                "tokenizer_config must be a JSON object");
  auto it = config.find("chat_template");
  LONGCTX_CHECK(it != config.end() && !it->is_null(), ErrorCode::kNotFound,
                "tokenizer_config has no chat_template");
  if (it->is_string()) return it->get<std::string>();
  // Some configs hold a list of named templates; apply_chat_template uses "default".
  if (it->is_array()) {
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template"))
        return entry["template"].get<std::string>();
    }
    LONGCTX_THROW(ErrorCode::kNotFound, "chat_template list has no entry named 'default'");
  }
  LONGCTX_THROW(ErrorCode::kInvalidArgument, "chat_template must be a string or a list, got {}",
                it->type_name());
}

std::string render_chat(const nlohmann::ordered_json& tokenizer_config,
                        const nlohmann::ordered_json& messages, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra_vars) {
  LONGCTX_CHECK(messages.is_array(), ErrorCode::kInvalidArgument,
                "messages must be a JSON array, got {}", messages.type_name());
  LONGCTX_CHECK(extra_vars.is_object() || extra_vars.is_null(), ErrorCode::kInvalidArgument,
                "extra_vars must be a JSON object, got {}", extra_vars.type_name());
  // Mirrors apply_chat_template: render(messages=..., tools=None, documents=None,
  // add_generation_prompt=..., **special_tokens_map, **kwargs).
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto it = tokenizer_config.find(name);
    if (it == tokenizer_config.end()) continue;
    if (it->is_string())
      context[name] = *it;
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      context[name] = (*it)["content"];
  }
  if (extra_vars.is_object())
    for (auto it = extra_vars.begin(); it != extra_vars.end(); ++it) context[it.key()] = it.value();
  return ChatTemplate::parse(chat_template_source(tokenizer_config)).render(context);
}

std::string render_chat(const nlohmann::json& tokenizer_config, const nlohmann::json& messages,
                        bool add_generation_prompt, const nlohmann::json& extra_vars) {
  return render_chat(nlohmann::ordered_json(tokenizer_config), nlohmann::ordered_json(messages),
                     add_generation_prompt, nlohmann::ordered_json(extra_vars));
}

}  // namespace longctx
