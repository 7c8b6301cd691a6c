// Syntax errors name line, column and what was expected; render errors name the line;
// raise_exception carries the template's message verbatim.
#include <gtest/gtest.h>

#include "longctx/template/chat_template.h"

namespace longctx {
namespace {

using Json = nlohmann::ordered_json;

// The message of the Error thrown by parsing (and rendering) `source`, or "" if none.
std::string error_of(const std::string& source, const Json& context = Json::object()) {
  try {
    ChatTemplate::parse(source).render(context);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

TEST(TemplateErrors, UnterminatedTags) {
  std::string e = error_of("ab\n  {{ x ");
  EXPECT_CONTAINS(e, "line 2, column 3");
  EXPECT_CONTAINS(e, "'}}'");
  e = error_of("{% if x %}yes");
  EXPECT_CONTAINS(e, "unexpected end of template");
  EXPECT_CONTAINS(e, "'elif', 'else' or 'endif'");
  e = error_of("{% for m in messages %}\n{{ m }}");
  EXPECT_CONTAINS(e, "'endfor' or 'else'");
  EXPECT_CONTAINS(e, "'for' from line 1");
  EXPECT_CONTAINS(error_of("{# never closed"), "missing end of comment tag");
  EXPECT_CONTAINS(error_of("{{ 'abc }}"), "unterminated string");
  EXPECT_CONTAINS(error_of("{% raw %}x"), "endraw");
}

TEST(TemplateErrors, UnknownFilterTestAndTag) {
  std::string e = error_of("a\n{{ x|bogus }}");
  EXPECT_CONTAINS(e, "no filter named 'bogus'");
  EXPECT_CONTAINS(e, "line 2, column 6");
  EXPECT_CONTAINS(error_of("{{ x is bogus }}"), "no test named 'bogus'");
  EXPECT_CONTAINS(error_of("{% include 'x' %}"), "unknown tag 'include'");
  e = error_of("{% for x in y %}{% endif %}{% endfor %}");
  EXPECT_CONTAINS(e, "unknown tag 'endif'");
  EXPECT_CONTAINS(e, "'endfor' or 'else'");
  EXPECT_CONTAINS(error_of("{% endfor %}"), "unknown tag 'endfor'");
}

TEST(TemplateErrors, BadExpressions) {
  EXPECT_CONTAINS(error_of("{{ 1 + }}"), "expected an expression, got '}}'");
  EXPECT_CONTAINS(error_of("{% for x y %}{% endfor %}"), "expected 'in', got 'y'");
  EXPECT_CONTAINS(error_of("{{ x $ y }}"), "unexpected character '$'");
  EXPECT_CONTAINS(error_of("{% if x %}{% else %}{% elif y %}{% endif %}"), "'elif'");
}

TEST(TemplateErrors, RaiseException) {
  const char* t =
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor "
      "%}";
  try {
    ChatTemplate::parse(t).render(Json{{"messages", Json::parse(R"([{"role": "tool"}])")}});
    FAIL() << "raise_exception did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Only user and assistant roles are supported!");
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(error_of(t, Json{{"messages", Json::parse(R"([{"role": "user"}])")}}), "");
}

TEST(TemplateErrors, RenderErrorsNameTheLine) {
  // Default Undefined: printing is fine, but attributes of it and arithmetic on it fail.
  std::string e = error_of("line1\n\n{{ foo.bar }}");
  EXPECT_CONTAINS(e, "line 3");
  EXPECT_CONTAINS(e, "'foo' is undefined");
  EXPECT_CONTAINS(error_of("{{ 'a' + foo }}"), "'foo' is undefined");
  EXPECT_CONTAINS(error_of("{{ 'a' + 1 }}"), "unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_CONTAINS(error_of("{% set x = 1 %}{% set x.y = 2 %}"), "non-namespace");
  EXPECT_CONTAINS(error_of("{% for x in none %}{% endfor %}"), "not iterable");
  EXPECT_CONTAINS(error_of("{{ 1 / 0 }}"), "division by zero");
  EXPECT_CONTAINS(error_of("{{ [1].append(2) }}"), "unsafe");
  EXPECT_CONTAINS(error_of("{{ x }}", Json::array()), "JSON object");
  EXPECT_CONTAINS(error_of("{{ 9223372036854775807 + 1 }}"), "integer overflow");
  EXPECT_CONTAINS(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
                  "recursed too deeply");
}

TEST(TemplateErrors, LoopControlOutsideLoop) {
  EXPECT_CONTAINS(error_of("{% break %}"), "'break' outside of a for-loop");
  EXPECT_CONTAINS(
      error_of("{% for x in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}"),
      "'continue' outside of a for-loop");
  EXPECT_EQ(ChatTemplate().source(), "");
  EXPECT_THROW(ChatTemplate().render(Json::object()), Error);
}

}  // namespace
}  // namespace longctx
