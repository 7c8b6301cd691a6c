// Hostile templates (issue 15): deep nesting, runaway work, huge outputs and integer edge cases
// end in a clear Error instead of a stack overflow, a hang, an OOM kill or a trap.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "longctx/template/chat_template.h"

namespace longctx {
namespace {

using Json = nlohmann::ordered_json;

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// The message of the Error thrown by parsing and rendering `source`, or "" if none.
std::string error_of(const std::string& source, const Json& context = Json::object()) {
  try {
    ChatTemplate::parse(source).render(context);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string render(const std::string& source, const Json& context = Json::object()) {
  return ChatTemplate::parse(source).render(context);
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

TEST(TemplateHostile, DeepBracketsAndBlocksAreSyntaxErrors) {
  EXPECT_CONTAINS(error_of("{{ " + repeat("(", 5000) + "1" + repeat(")", 5000) + " }}"),
                  "nested too deeply");
  EXPECT_CONTAINS(error_of("{{ " + repeat("[", 5000) + repeat("]", 5000) + " }}"),
                  "nested too deeply");
  EXPECT_CONTAINS(error_of(repeat("{% if true %}", 20000) + repeat("{% endif %}", 20000)),
                  "nested too deeply");
  EXPECT_CONTAINS(error_of(repeat("{% for x in [1] %}", 20000) + repeat("{% endfor %}", 20000)),
                  "nested too deeply");
  EXPECT_CONTAINS(error_of("{{ " + repeat("not ", 200000) + "1 }}"), "nested too deeply");
  EXPECT_CONTAINS(error_of("{{ " + repeat("-", 200000) + "1 }}"), "nested too deeply");
  // Moderate nesting as real templates use it still works.
  EXPECT_EQ(render("{{ " + repeat("(", 100) + "1" + repeat(")", 100) + " }}"), "1");
  EXPECT_EQ(render(repeat("{% if true %}", 100) + "x" + repeat("{% endif %}", 100)), "x");
}

TEST(TemplateHostile, LongChainsAreSyntaxErrors) {
  // Chains parse in loops but build one tree level per link; the evaluator and the tree's
  // destructor recurse over them.
  EXPECT_CONTAINS(error_of("{{ 'a'" + repeat(" ~ 'a'", 200000) + " }}"), "nested too deeply");
  EXPECT_CONTAINS(error_of("{{ 2" + repeat(" ** 1", 200000) + " }}"), "nested too deeply");
  EXPECT_CONTAINS(error_of("{{ 'a'" + repeat("|upper", 200000) + " }}"), "nested too deeply");
  EXPECT_CONTAINS(error_of("{{ x" + repeat(".a", 200000) + " }}"), "nested too deeply");
  EXPECT_CONTAINS(error_of("{{ x" + repeat("[0]", 200000) + " }}"), "nested too deeply");
  EXPECT_EQ(render("{{ 'a'" + repeat(" ~ 'a'", 99) + " }}"), repeat("a", 100));
}

TEST(TemplateHostile, RecursionAtRenderTimeIsBounded) {
  // A macro that recurses through deep expressions: the evaluation depth limit stops it.
  std::string deep = repeat("[", 200) + "f(n + 1)" + repeat("]", 200);
  std::string e = error_of("{% macro f(n) %}{{ " + deep + " }}{% endmacro %}{{ f(0) }}");
  EXPECT_CONTAINS(e, "nested too deeply while rendering");
  // Values cannot be nested without bound either (their printers and destructors recurse).
  e = error_of(
      "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}{{ ns.x }}");
  EXPECT_CONTAINS(e, "nested too deeply");
  // A namespace holding itself would be a cycle.
  EXPECT_CONTAINS(error_of("{% set ns = namespace() %}{% set ns.me = [ns] %}"),
                  "cannot assign a namespace");
}

TEST(TemplateHostile, DeepContextIsAnError) {
  Json deep = 1;
  for (int i = 0; i < 2000; ++i) deep = Json::array({deep});
  EXPECT_CONTAINS(error_of("{{ x }}", Json{{"x", deep}}), "nested too deeply");
}

TEST(TemplateHostile, MemoryBudget) {
  EXPECT_CONTAINS(error_of("{{ 'a' * 10**10 }}"), "memory budget");
  EXPECT_CONTAINS(error_of("{{ ['a'] * 10**10 }}"), "memory budget");
  EXPECT_CONTAINS(error_of("{{ [1, [2]] | tojson(indent=2000000000) }}"), "memory budget");
  EXPECT_CONTAINS(error_of("{{ [1, [2]] | tojson(indent=2e9) }}"), "memory budget");
  EXPECT_CONTAINS(error_of("{{ 'x' | indent(2000000000, true) }}"), "memory budget");
  EXPECT_CONTAINS(error_of("{{ '%2000000000d' % 1 }}"), "format width or precision too large");
  // One 1 MB string printed 2,000 times by a list's repr, and joined 2,000 times.
  const std::string big = "{% set s = 'a' * 1000000 %}{% set l = [s] * 2000 %}";
  EXPECT_CONTAINS(error_of(big + "{{ l }}"), "memory budget");
  EXPECT_CONTAINS(error_of(big + "{{ l | join(s) }}"), "memory budget");
  EXPECT_CONTAINS(error_of(big + "{{ ('a' * 2000) | replace('a', s) }}"), "memory budget");
  EXPECT_EQ(render("{{ '' * 10**18 }}"), "");
}

TEST(TemplateHostile, StepBudget) {
  auto t0 = std::chrono::steady_clock::now();
  std::string e =
      error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_CONTAINS(e, "budget");  // steps or the loop objects' bytes, whichever runs out first
  e = error_of("{% set l = range(100000) | list %}{% for i in l %}{{ i in l }}{% endfor %}");
  EXPECT_CONTAINS(e, "step budget");
  // 1 ** INT64_MAX is computed by squaring, not by INT64_MAX multiplications.
  EXPECT_EQ(render("{{ 1 ** 9223372036854775807 }}{{ (-1) ** 9223372036854775807 }}"), "1-1");
  EXPECT_EQ(render("{{ 3 ** 39 }}"), "4052555153018976267");
  EXPECT_CONTAINS(error_of("{{ 3 ** 40 }}"), "integer overflow");
  EXPECT_CONTAINS(error_of("{{ 2 ** 9223372036854775807 }}"), "integer overflow");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 20.0);
}

TEST(TemplateHostile, IntegerEdgeCases) {
  const std::string min = "(-9223372036854775807 - 1)";
  EXPECT_CONTAINS(error_of("{{ " + min + " // -1 }}"), "integer overflow");
  EXPECT_EQ(render("{{ " + min + " % -1 }}"), "0");
  EXPECT_EQ(render("{{ 7 // -1 }} {{ 7 % -1 }} {{ -7 // 2 }} {{ -7 % 2 }}"), "-7 0 -4 1");
  EXPECT_CONTAINS(error_of("{{ -" + min + " }}"), "integer overflow");
  EXPECT_CONTAINS(error_of("{{ " + min + " | abs }}"), "integer overflow");
  EXPECT_CONTAINS(error_of("{{ 1e300 | int }}"), "integer overflow");
  EXPECT_CONTAINS(error_of("{{ '1e300' | int }}"), "integer overflow");
  EXPECT_EQ(render("{{ [1, 2, 3][2::9223372036854775806] }}"), "[3]");
  EXPECT_EQ(render("{{ 'abc'[2::9223372036854775806] }}"), "c");
  EXPECT_EQ(render("{{ [1, 2, 3][::" + min + "] }}"), "[3]");
  EXPECT_EQ(render("{{ 'abcdef'[::-2] }} {{ 'abcdef'[1:5:3] }}"), "fdb be");
  EXPECT_EQ(render("{{ range(0, 9223372036854775807, 9223372036854775806) | list }}"),
            "[0, 9223372036854775806]");
  EXPECT_EQ(render("{{ range(5, -5, -4) | list }}"), "[5, 1, -3]");
  EXPECT_CONTAINS(error_of("{{ '{99999999999999999999}'.format(1) }}"), "no argument for field");
  // An attribute path part too long for an int64 is a name, not a std::out_of_range.
  EXPECT_EQ(render("{{ [[1]] | map(attribute='0.99999999999999999999') | list }}"), "[Undefined]");
}

TEST(TemplateHostile, PercentFormatIsNotTruncated) {
  Json ctx = {{"s", std::string(2000, 'x')}};
  EXPECT_EQ(render("{{ '%s!' % s }}", ctx), std::string(2000, 'x') + "!");
  EXPECT_EQ(render("{{ '%5s|%-5s|%.2s' % ('ab', 'cd', 'xyz') }}"), "   ab|cd   |xy");
  EXPECT_EQ(render("{{ '%05d %x %.3f' % (42, 255, 2.5) }}"), "00042 ff 2.500");
  EXPECT_EQ(render("{{ '%600d' % 1 }}").size(), 600u);
}

}  // namespace
}  // namespace longctx
