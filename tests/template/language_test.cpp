// Jinja language features on small hand-written templates. Expected outputs follow jinja2's
// semantics with transformers' environment (trim_blocks, lstrip_blocks, default Undefined).
#include <gtest/gtest.h>

#include "longctx/template/chat_template.h"

namespace longctx {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& source, const Json& context = Json::object()) {
  return ChatTemplate::parse(source).render(context);
}

const Json kMessages = Json::parse(R"([
  {"role": "system", "content": "S"},
  {"role": "user", "content": "hi"},
  {"role": "assistant", "content": "yo"}
])");

TEST(TemplateLiterals, PrintLikePython) {
  EXPECT_EQ(render("{{ 'a' }}{{ \"b\" }}{{ 1 }} {{ 1.5 }} {{ true }} {{ False }} {{ none }}"),
            "ab1 1.5 True False None");
  EXPECT_EQ(render("{{ [1, 'x', none] }} {{ {'k': 'v', 'n': [2]} }} {{ ('a', 1) }} {{ (1,) }}"),
            "[1, 'x', None] {'k': 'v', 'n': [2]} ('a', 1) (1,)");
  EXPECT_EQ(render("{{ \"it's\" }} {{ [\"it's\", 'say \"x\"'] }}"), "it's [\"it's\", 'say \"x\"']");
}

TEST(TemplateLiterals, FloatsUsePythonRepr) {
  EXPECT_EQ(render("{{ 1.0 }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-5 }} {{ 1/3 }} {{ 0.1 + 0.2 }}"),
            "1.0 1e+20 0.0001 1e-05 0.3333333333333333 0.30000000000000004");
  EXPECT_EQ(render("{{ 1e16 }} {{ 1.5e15 }} {{ 100.0 }} {{ 4 / 2 }} {{ 2.5e-3 }}"),
            "1e+16 1500000000000000.0 100.0 2.0 0.0025");
}

TEST(TemplateLiterals, StringEscapes) {
  EXPECT_EQ(render(R"({{ "a\tb\n\u00e9\x41\\ \'q\' \d" }})"),
            "a\tb\n\xc3\xa9"
            "A\\ 'q' \\d");
  EXPECT_EQ(render("{{ 'multi\nline' }}{{ 'a' 'b' }}"), "multi\nlineab");
}

TEST(TemplateStatements, IfElifElse) {
  const char* t = "{% if x > 2 %}big{% elif x == 2 %}two{% else %}small{% endif %}";
  EXPECT_EQ(render(t, {{"x", 5}}), "big");
  EXPECT_EQ(render(t, {{"x", 2}}), "two");
  EXPECT_EQ(render(t, {{"x", 0}}), "small");
  EXPECT_EQ(render("{% if missing %}a{% else %}b{% endif %}"), "b");
}

TEST(TemplateStatements, ForLoopVariables) {
  EXPECT_EQ(
      render("{% for x in ['a','b','c'] %}{{ x }}{{ loop.index }}{{ loop.index0 }}"
             "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}"),
      "a10TrueFalse33|b21FalseFalse32|c32FalseTrue31|");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }};"
                   "{% endfor %}"),
            "<1>2;1<2>3;2<3>;");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.cycle('o', 'e') }}{{ x }}{% endfor %}"), "oaeb");
}

TEST(TemplateStatements, ForElseFilterBreakContinue) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in nothing %}x{% else %}empty{% endfor %}"), "empty");
  // The filter runs before the loop, so loop.* count only the kept items.
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ loop.index }}:{{ x }}/"
                   "{{ loop.length }};{% endfor %}"),
            "1:2/2;2:4/2;");
  EXPECT_EQ(render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}"
                   "{% if x == 3 %}{% break %}{% endif %}{% endfor %}"),
            "13");
}

TEST(TemplateStatements, ForOverDictAndUnpacking) {
  Json ctx = {{"d", Json::parse(R"({"b": 1, "a": 2})")}};
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", ctx), "ba");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=2;");
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=2;");
  EXPECT_EQ(render("{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %}", ctx), "a2b1");
}

TEST(TemplateStatements, SetScopingAndNamespace) {
  // A set inside a loop body lives for that iteration only; reads before it see the outer value.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}[{{ x }}]{% endfor %}"
                   "{{ x }}"),
            "[2][3]1");
  EXPECT_EQ(render("{% for i in [1,2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]"
                   "{% endfor %}"),
            "[5][]");
  EXPECT_EQ(render("{% set ns = namespace(total=0, seen=false) %}{% for i in [1,2,3] %}"
                   "{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }} {{ ns.seen }}"),
            "6 False");
  EXPECT_EQ(render("{% if true %}{% set z = 'top' %}{% endif %}{{ z }}"), "top");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set s %}v={{ 1 + 1 }}{% endset %}[{{ s }}]"), "[v=2]");
}

TEST(TemplateStatements, Macro) {
  EXPECT_EQ(render("{% macro f(a, b=2) %}[{{ a }}|{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, b=3) }}"
                   "{{ f('x', 'y') }}"),
            "[1|2][1|3][x|y]");
}

TEST(TemplateStatements, RawAndGeneration) {
  EXPECT_EQ(render("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
  EXPECT_EQ(render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(TemplateWhitespace, TrimAndLstripBlocks) {
  // trim_blocks eats the newline after %}, lstrip_blocks the indentation before {%.
  EXPECT_EQ(render("{% for m in msgs %}\n    {% if m.role == 'user' %}\n        U{{ loop.index }}\n"
                   "    {% endif %}\n{% endfor %}\n",
                   {{"msgs", kMessages}}),
            "        U2\n");
  // Not for {{ }}: a variable tag keeps its newline and indentation.
  EXPECT_EQ(render("  {{ 'x' }}\n  {{ 'y' }}"), "  x\n  y");
  // lstrip only applies when the tag starts its line.
  EXPECT_EQ(render("a  {% if true %}b{% endif %}"), "a  b");
  // Comments behave like blocks; one trailing newline of the template is dropped.
  EXPECT_EQ(render("a\n  {# note #}\nb\n"), "a\nb");
}

TEST(TemplateWhitespace, ExplicitControl) {
  EXPECT_EQ(render("x  \n {%- if true -%}  \n y \n {%- endif %}"), "xy");
  EXPECT_EQ(render("a \n {{- 'b' -}} \n c"), "abc");
  // {%+ keeps the indentation, +%} keeps the newline.
  EXPECT_EQ(render("a\n  {%+ if true %}\nb\n{% endif +%}\nc"), "a\n  b\n\nc");
  EXPECT_EQ(render("{#- c -#}  \n  A"), "A");
  EXPECT_EQ(render("line1\r\n{% if true %}\r\nline2\r\n{% endif %}\r\n"), "line1\nline2\n");
}

TEST(TemplateExpressions, ArithmeticAndPrecedence) {
  EXPECT_EQ(render("{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} "
                   "{{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 1.5 }} {{ 10 - 2.5 }}"),
            "14 20 3 -4 2 3.5 1024 2.5 7.5");
  // Filters bind tighter than arithmetic: messages|length - 1 is (messages|length) - 1.
  EXPECT_EQ(render("{{ messages|length - 1 }} {{ -2|abs }} {{ 2 ** 3 ** 2 }}",
                   {{"messages", Json::array({1, 2})}}),
            "1 2 64");
  EXPECT_EQ(render("{{ [1, 2] + [3] }} {{ 'ab' * 2 }} {{ 'a' ~ 1 ~ none ~ missing }}"),
            "[1, 2, 3] abab a1None");
  EXPECT_EQ(render("{{ '%s-%d' % ('a', 3) }} {{ '%.2f'|format(3.14159) }}"), "a-3 3.14");
}

TEST(TemplateExpressions, LogicComparisonsAndConditionals) {
  EXPECT_EQ(
      render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ '1' == 1 }} {{ [1] == [1] }}"),
      "True False True False True");
  EXPECT_EQ(render("{{ 'ab' in 'cabd' }} {{ 1 not in [1, 2] }} {{ 'k' in {'k': 1} }} "
                   "{{ not 1 == 2 }} {{ x in missing }}"),
            "True False True True False");
  EXPECT_EQ(render("{{ x or 'dflt' }} {{ x and 'yes' }} {{ 'y' and 'yes' }}", {{"x", ""}}),
            "dflt  yes");
  EXPECT_EQ(
      render("[{{ 'a' if false }}] {{ 'x' if true else 'y' }} {{ 1 if 0 else 2 if 1 else 3 }}"),
      "[] x 2");
}

TEST(TemplateExpressions, AccessAndSlicing) {
  Json ctx = {{"messages", kMessages}, {"d", Json::parse(R"({"a": 1, "b": [2, 3]})")}};
  EXPECT_EQ(
      render("{{ messages[0].role }} {{ messages[-1]['content'] }} {{ d.b[1] }} {{ d.b.0 }}", ctx),
      "system yo 3 2");
  EXPECT_EQ(render("[{{ d.zz }}] {{ d.zz is defined }} [{{ d['zz'] }}] [{{ d.b[9] }}]", ctx),
            "[] False [] []");
  EXPECT_EQ(render("{{ messages[::-1]|map(attribute='role')|join(',') }} {{ 'abcdef'[1:4] }} "
                   "{{ 'abcdef'[::2] }} {{ [1,2,3,4][-2:] }} {{ [1,2,3][:-1] }} {{ 'abc'[::-1] }}",
                   ctx),
            "assistant,user,system bcd ace [3, 4] [1, 2] cba");
  // Strings are indexed and measured in code points, like Python str.
  EXPECT_EQ(render("{{ 'h\xc3\xa9llo'|length }} {{ 'h\xc3\xa9llo'[1] }} {{ 'h\xc3\xa9'[::-1] }}"),
            "5 \xc3\xa9 \xc3\xa9h");
}

TEST(TemplateExpressions, DictMethodsWinOverKeysForDotAccess) {
  // A JSON schema's "items" key: d.items is the dict method (getattr first), d['items'] the key.
  Json ctx = {{"d", Json::parse(R"({"type": "array", "items": {"type": "string"}})")},
              {"e", Json::object()}};
  EXPECT_EQ(
      render("{{ d.items is defined }} {{ d['items'] }} [{{ d.items.type }}] "
             "{{ e.items is defined }} {{ d.get is defined }} {{ d.type }} {{ d.get('type') }}",
             ctx),
      "True {'type': 'string'} [] True True array array");
}

TEST(TemplateExpressions, UndefinedBehavesLikeJinjaDefault) {
  EXPECT_EQ(render("[{{ nope }}] {{ nope|length }} {{ nope is defined }} {{ nope is undefined }} "
                   "{% if not nope %}falsy{% endif %} {{ nope|default('d') }}"),
            "[] 0 False True falsy d");
  EXPECT_EQ(render("{{ none|default('d') }} {{ ''|default('d', true) }} {{ x.get('k', 'z') }}",
                   {{"x", Json::object()}}),
            "None d z");
}

// sort computes each item's key once (fuzz_chat_template: lowering per comparison crawled); the
// order must stay Jinja's: stable, case-insensitive unless asked, reverse, by attribute.
TEST(TemplateFilters, SortMinMaxOrder) {
  EXPECT_EQ(render("{{ ['b','B','a','A']|sort }} {{ ['b','B','a','A']|sort(case_sensitive=true) }} "
                   "{{ ['b','B','a','A']|sort(reverse=true) }} {{ ['bX','ax','Ay']|max }} "
                   "{{ ['bX','ax','Ay']|min }}"),
            "['a', 'A', 'b', 'B'] ['A', 'B', 'a', 'b'] ['b', 'B', 'a', 'A'] bX ax");
  Json ctx = {
      {"xs",
       Json::array({{{"n", "b"}, {"i", 1}}, {{"n", "A"}, {"i", 2}}, {{"n", "a"}, {"i", 3}}})}};
  EXPECT_EQ(render("{% for x in xs|sort(attribute='n') %}{{ x.i }}{% endfor %}", ctx), "231");
}

TEST(TemplateFilters, Common) {
  Json ctx = {{"messages", kMessages}};
  EXPECT_EQ(
      render("{{ '  hi \n'|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hello'|upper }}{{ 'Hello'|lower }}"
             "|{{ 'hello world'|capitalize }}|{{ 'a-b c'|title }}|{{ 'aXa'|replace('a', 'b') }}"),
      "hi|hi|HELLOhello|Hello world|A-B C|bXb");
  EXPECT_EQ(render("{{ [3,1,2]|first }}{{ [3,1,2]|last }} {{ [3,1,2]|sort|join(',') }} "
                   "{{ ['b','A','c']|sort }} {{ [1,2,2,1]|unique|list }} {{ [1,2,3]|sum }} "
                   "{{ [1,5,3]|max }} {{ [4,2]|min }} {{ [1,2]|reverse|list }}"),
            "32 1,2,3 ['A', 'b', 'c'] [1, 2] 6 5 2 [2, 1]");
  EXPECT_EQ(
      render("{{ '3'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ 3.7|int }} {{ '2.5'|float }} "
             "{{ 2.5|round }} {{ 3.14159|round(2) }} {{ -3|abs }} {{ 1|string ~ 'a' }} "
             "{{ 'ab'|list }} {{ 'x'|safe }}"),
      "4 3 0 3 2.5 2.0 3.14 3 1a ['a', 'b'] x");
  EXPECT_EQ(
      render("{{ messages|map(attribute='role')|join(', ') }}|"
             "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|"
             "{{ messages|rejectattr('role', 'in', ['system'])|map(attribute='content')|list }}|"
             "{{ [1, 2, 3, 4]|select('odd')|list }}{{ [0, 1, '']|select|list }}"
             "{{ [1, 2, 3]|reject('even')|list }}|{{ ['a', 'b']|map('upper')|join }}",
             ctx),
      "system, user, assistant|1|['hi', 'yo']|[1, 3][1][1, 3]|AB");
  EXPECT_EQ(render("{{ 'l1\nl2\n\nl4'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"),
            "l1\n  l2\n\n  l4|  a\n  b");
}

TEST(TemplateFilters, UnicodeCaseAndNumbers) {
  // Python's str.upper/lower beyond ASCII (Latin, Greek, Cyrillic; "ß" -> "SS").
  EXPECT_EQ(render("{{ 'h\u00e9llo w\u00f6rld'|upper }} {{ '\u00c0\u00c9\u00ce "
                   "\u03a9\u03bc\u03ad\u03b3\u03b1 "
                   "\u041f\u0420\u0418\u0412\u0415\u0422'|lower }} {{ 'stra\u00dfe'|upper }} "
                   "{{ '\u00e9lan vital'|title }} {{ '\u0141\u00f3d\u017a'.lower() }} "
                   "{{ '\u0142\u00f3d\u017a'|capitalize }}"),
            "H\u00c9LLO W\u00d6RLD \u00e0\u00e9\u00ee \u03c9\u03bc\u03ad\u03b3\u03b1 "
            "\u043f\u0440\u0438\u0432\u0435\u0442 STRASSE \u00c9lan Vital \u0142\u00f3d\u017a "
            "\u0141\u00f3d\u017a");
  // round() of an int stays an int; odd/even/divisibleby are `value % n` tests.
  EXPECT_EQ(render("{{ 3|round }} {{ 2.5 is odd }} {{ 3.0 is odd }} {{ 10 is divisibleby 2.5 }}"),
            "3 False True True");
}

// Jinja's round: 'common' is Python's round() (ints stay ints, ties to even on the exact binary
// value, any precision), 'ceil'/'floor' give floats. The expected strings are what jinja2 3.1
// renders for the same templates.
TEST(TemplateFilters, RoundAsJinja) {
  EXPECT_EQ(render("{{ 309|round }} {{ 309.0|round }} {{ 1.5|round(309) }} {{ 309|round(2) }}"),
            "309 309.0 1.5 309");
  EXPECT_EQ(render("{{ 2.675|round(2) }} {{ 0.125|round(2) }} {{ 0.375|round(2) }} "
                   "{{ 2.5|round }} {{ 3.5|round }} {{ -0.4|round }}"),
            "2.67 0.12 0.38 2.0 4.0 -0.0");
  EXPECT_EQ(render("{{ 1234.5678|round(-2) }} {{ 1250|round(-2) }} {{ 1350|round(-2) }} "
                   "{{ -1250|round(-2) }} {{ 1251|round(-2) }} {{ 123456789012345678|round(-5) }}"),
            "1200.0 1200 1400 -1200 1300 123456789012300000");
  EXPECT_EQ(render("{{ 1.5|round(-400) }} {{ 1e300|round(-299) }} {{ 5e-324|round(400) }} "
                   "{{ 60.0|round(-2) }} {{ 40.0|round(-2) }} {{ 50.0|round(-2) }}"),
            "0.0 1e+300 5e-324 100.0 0.0 0.0");
  EXPECT_EQ(render("{{ 2.1|round(0, 'ceil') }} {{ 2.9|round(0, 'floor') }} "
                   "{{ 309|round(0, 'floor') }} {{ 2.123|round(2, 'ceil') }} "
                   "{{ -2.5|round(0, 'floor') }} {{ 1234|round(-2, 'ceil') }} "
                   "{{ 2.5|round(method='floor') }} {{ 7|round(precision=1, method='ceil') }}"),
            "3.0 2.0 309.0 2.13 -3.0 1300.0 2.0 7.0");
  for (const char* bad : {"{{ 1.5|round(1, 'up') }}", "{{ 1.5|round(1.5) }}", "{{ 'x'|round }}",
                          "{{ 1.5|round(400, 'ceil') }}"}) {
    EXPECT_THROW(render(bad), Error) << bad;
  }
}

TEST(TemplateFilters, ToJsonMatchesTransformers) {
  // transformers' tojson is json.dumps(ensure_ascii=False): ", " and ": " separators, non-ASCII
  // kept, no HTML escaping, key order as given; indent switches to "," item separators.
  Json ctx = {
      {"x",
       Json::parse(R"({"b": [1, 2.5, "\u00e9\n\"<"], "a": {}, "c": [], "d": null, "e": true})")}};
  EXPECT_EQ(
      render("{{ x|tojson }}", ctx),
      "{\"b\": [1, 2.5, \"\xc3\xa9\\n\\\"<\"], \"a\": {}, \"c\": [], \"d\": null, \"e\": true}");
  EXPECT_EQ(render("{{ x.b|tojson(indent=2) }}", ctx),
            "[\n  1,\n  2.5,\n  \"\xc3\xa9\\n\\\"<\"\n]");
  EXPECT_EQ(render("{{ x|tojson(separators=(',', ':'), sort_keys=true) }}", ctx),
            "{\"a\":{},\"b\":[1,2.5,\"\xc3\xa9\\n\\\"<\"],\"c\":[],\"d\":null,\"e\":true}");
  EXPECT_EQ(render("{{ '\\x01\\t'|tojson }} {{ '\xf0\x9f\x98\x80'|tojson(ensure_ascii=true) }} "
                   "{{ 1e100|tojson }}"),
            "\"\\u0001\\t\" \"\\ud83d\\ude00\" 1e+100");
}

TEST(TemplateMethods, StringAndDict) {
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} {{ '  a  b '.split() }} "
                   "{{ 'a,b,c'.rsplit(',', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b c'] ['a', 'b'] ['a,b', 'c']");
  EXPECT_EQ(
      render(
          "{{ '\\n\\nx\\n'.strip('\\n') }}|{{ '  x  '.lstrip() }}|{{ 'xyy'.rstrip('y') }}|"
          "{{ 'x'.startswith(('a', 'x')) }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith('b') }}|"
          "{{ 'abab'.replace('a', 'c', 1) }}|{{ 'aB'.upper() }}{{ 'aB'.lower() }}|"
          "{{ '{}-{name}'.format(1, name='n') }}|{{ ', '.join(['a', 'b']) }}"),
      "x|x  |x|TrueTrueFalse|cbab|ABab|1-n|a, b");
  // str.title() (Python: after any uncased character) differs from the title filter (Jinja:
  // after whitespace, hyphens and brackets).
  EXPECT_EQ(render("{{ 'a,b a1b'.title() }} {{ 'a,b a1b'|title }}"), "A,B A1B A,b A1b");
  Json ctx = {{"d", Json::parse(R"({"a": 1, "b": [2]})")}};
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys()|list }} "
                   "{{ d.values()|list }} {{ d.items()|list }}",
                   ctx),
            "1 None 5 ['a', 'b'] [1, [2]] [('a', 1), ('b', [2])]");
  // Qwen3's split of reasoning from content.
  EXPECT_EQ(render("{% set c = '<think>\\nr\\n</think>\\n\\nans' %}"
                   "{{ c.split('</think>')[-1].lstrip('\\n') }}|"
                   "{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}"),
            "ans|r");
}

TEST(TemplateTests, TypeAndValueTests) {
  EXPECT_EQ(
      render("{{ none is none }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} "
             "{{ true is integer }} {{ 1.0 is float }} {{ 'a' is string }} {{ 1 is string }}"),
      "True True True True False True True False");
  EXPECT_EQ(
      render("{{ {} is mapping }} {{ [] is mapping }} {{ 'a' is sequence }} {{ [] is iterable }} "
             "{{ 1 is iterable }} {{ 1 is true }} {{ true is true }} {{ false is false }} "
             "{{ 0 is false }}"),
      "True False True True False False True True False");
  EXPECT_EQ(render("{{ 4 is even }} {{ 5 is odd }} {{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} "
                   "{{ 3 is gt 2 }} {{ 3 is eq(3) }} {{ x is not none }} {{ x is not string }}",
                   {{"x", "s"}}),
            "True True True True True True True False");
  // Jinja's "enable_thinking is defined and enable_thinking is false".
  const char* t = "{% if flag is defined and flag is false %}off{% else %}on{% endif %}";
  EXPECT_EQ(render(t), "on");
  EXPECT_EQ(render(t, {{"flag", false}}), "off");
  EXPECT_EQ(render(t, {{"flag", 0}}), "on");
}

TEST(TemplateGlobals, RangeDictNamespace) {
  EXPECT_EQ(render("{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ dict(a=1, b='x') }} "
                   "{{ namespace(a=1).a }}"),
            "[0, 1, 2] [1, 4, 7] {'a': 1, 'b': 'x'} 1");
}

TEST(RenderChat, ContextFromTokenizerConfig) {
  Json config = Json::parse(R"({
    "bos_token": {"content": "<s>", "lstrip": false},
    "eos_token": "</s>",
    "unk_token": null,
    "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}|{{ tools is none }}|{{ unk_token is defined }}|{{ documents is none }}|{{ extra }}"
  })");
  Json messages = Json::parse(R"([{"role": "user", "content": "q"}])");
  EXPECT_EQ(render_chat(config, messages, true, Json{{"extra", 7}}),
            "<s>user:q</s>assistant:|True|False|True|7");
  EXPECT_EQ(render_chat(config, messages, false), "<s>user:q</s>|True|False|True|");
  // nlohmann::json (sorted keys) works too.
  EXPECT_EQ(render_chat(nlohmann::json(config), nlohmann::json(messages), false),
            "<s>user:q</s>|True|False|True|");
}

TEST(RenderChat, NamedTemplateList) {
  Json config = Json::parse(R"({"chat_template": [
    {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]})");
  EXPECT_EQ(render_chat(config, Json::array(), false), "D0");
  EXPECT_THROW(render_chat(Json::object(), Json::array(), false), Error);
}

}  // namespace
}  // namespace longctx
