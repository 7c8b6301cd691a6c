// Chat templates: renders the Jinja `chat_template` of a tokenizer_config.json the way
// transformers' apply_chat_template does (jinja2 ImmutableSandboxedEnvironment with
// trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, the loopcontrols extension,
// transformers' tojson (json.dumps, ensure_ascii=False), raise_exception and strftime_now).
//
//   ChatTemplate t = ChatTemplate::parse(config["chat_template"]);   // parse once, render often
//   std::string prompt = t.render({{"messages", msgs}, {"add_generation_prompt", true}});
//
// Supported (src/template/): if/elif/else; for (loop.index/index0/revindex/first/last/length/
// previtem/nextitem/cycle, `else`, `if` filter, tuple unpacking, break/continue); set (incl.
// `ns.attr = ...` on namespace(), `set a, b = ...`, set blocks); macros; raw; {% generation %};
// whitespace control -, +; Python literals, operators, slicing, str/dict/list methods
// (split, strip, startswith, replace, format, get, items, ...); Jinja's built-in filters and
// tests used by chat templates; undefined values behave like jinja2's default Undefined (print
// as "", falsy, iterate as empty; attribute access or arithmetic on them is an error).
// Not supported (clear error at parse time): call/filter/with blocks, include/import/extends,
// recursive loops, *args/**kwargs at call sites. Known differences from jinja2: filters that
// return lazy generators in Python (select, map, unique, ...) are eager here, dict views print
// as lists, case mapping covers Latin/Greek/Cyrillic only.
//
// Errors: a syntax error throws longctx::Error naming line, column and what was expected; a
// render error (undefined variable used, type error) names the template line;
// raise_exception('msg') in the template throws a longctx::Error whose what() is exactly msg.
// Dict order is kept as given: pass nlohmann::ordered_json where key order matters (tojson of
// tool schemas and tool-call arguments prints keys in that order, as Python does).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "longctx/core/error.h"

namespace longctx {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Parses `source`; throws longctx::Error (kInvalidArgument) on a syntax error.
  static ChatTemplate parse(std::string source);

  // Renders with `context` (a JSON object) as the template's variables.
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

  const std::string& source() const;  // "" for a default-constructed (empty) template

 private:
  std::shared_ptr<const jinja::Program> program_;
  std::shared_ptr<const std::string> source_;
};

// apply_chat_template(messages, add_generation_prompt, tokenize=False, **extra_vars) for a
// tokenizer_config.json: takes its `chat_template` (a string, or the entry named "default" when
// it is a list of {name, template}), sets bos/eos/unk/pad tokens from the config (strings or
// AddedToken objects with "content"; absent or null ones stay undefined), `tools` and
// `documents` to none unless extra_vars gives them, then extra_vars (e.g. enable_thinking).
std::string render_chat(
    const nlohmann::ordered_json& tokenizer_config, const nlohmann::ordered_json& messages,
    bool add_generation_prompt,
    const nlohmann::ordered_json& extra_vars = nlohmann::ordered_json::object());
std::string render_chat(const nlohmann::json& tokenizer_config, const nlohmann::json& messages,
                        bool add_generation_prompt,
                        const nlohmann::json& extra_vars = nlohmann::json::object());

// The template text of a tokenizer_config.json (see render_chat); throws kNotFound if absent.
std::string chat_template_source(const nlohmann::ordered_json& tokenizer_config);

}  // namespace longctx
