// The template engine on small templates whose Python jinja2 output is known
// (the chat templates themselves are compared with python3-jinja2 by
// tests/python/chat_template_reference.py).
#include "jinja/template.h"

#include <gtest/gtest.h>

namespace failsafe::jinja {
namespace {

std::string Render(const std::string& source, const nlohmann::ordered_json& vars = {}) {
  auto t = Template::Parse(source, "t");
  if (!t.ok()) return "PARSE ERROR: " + t.status().message();
  Dict context;
  if (vars.is_object()) {
    for (const auto& [k, v] : vars.items()) context.Set(Value(k), Value::FromJson(v));
  }
  auto r = (*t)->Render(context);
  return r.ok() ? *r : "ERROR: " + r.status().message();
}

TEST(Jinja, WhitespaceControlAsHuggingFaceConfiguresIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before it too; "-" strips all whitespace on its side.
  EXPECT_EQ(Render("{% if true %}\n  yes\n{% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(Render("a\n    {% if true %}b{% endif %}"), "a\nb");
  EXPECT_EQ(Render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(Render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(Render("{# comment #}\nx"), "x");
  EXPECT_EQ(Render("{{ 'x' }}\n"), "x");  // one trailing newline is dropped
  EXPECT_EQ(Render("{{ 'x' }}\n\n"), "x\n");
  EXPECT_EQ(Render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
}

TEST(Jinja, PythonValuesPrintAsPythonDoes) {
  EXPECT_EQ(
      Render("{{ none }} {{ true }} {{ 1.0 }} {{ 1e-5 }} {{ 3 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }}"),
      "None True 1.0 1e-05 1.5 3 2");
  EXPECT_EQ(Render("{{ [1, 'a', none] }} {{ {'k': (1, 'b')} }} {{ (1,) }}"),
            "[1, 'a', None] {'k': (1, 'b')} (1,)");
  EXPECT_EQ(Render("{{ [\"it's\"] }} {{ ['a\\nb'] }}"), "[\"it's\"] ['a\\nb']");
  EXPECT_EQ(Render("{{ undefined_name }}|{{ x.y is defined }}", {{"x", {{"z", 1}}}}), "|False");
}

TEST(Jinja, LoopsScopesAndNamespaces) {
  EXPECT_EQ(Render("{% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}/{{ loop.length }}"
                   "{{ ',' if not loop.last }}{% endfor %}"),
            "1/2,2/2");
  // A set inside a loop stays in that iteration; a namespace carries over.
  EXPECT_EQ(Render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for i in range(3) %}"
                   "{% set n = n + 1 %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 3");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   {{"d", {{"b", 1}, {"a", 2}}}}),
            "b=1;a=2;");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}"
                   "{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
}

TEST(Jinja, FiltersTestsAndMethods) {
  EXPECT_EQ(Render("{{ '  hi  ' | trim }}|{{ 'a,b' .split(',') }}|{{ 'Hello' | upper }}"),
            "hi|['a', 'b']|HELLO");
  EXPECT_EQ(
      Render("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='c') | join('+') }}",
             {{"m",
               {{{"role", "user"}, {"c", "a"}},
                {{"role", "x"}, {"c", "b"}},
                {{"role", "user"}, {"c", "c"}}}}}),
      "a+c");
  EXPECT_EQ(Render("{{ {'b': 1, 'a': [1, 2.5, 'é']} | tojson }}"),
            "{\"b\": 1, \"a\": [1, 2.5, \"é\"]}");
  EXPECT_EQ(Render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(Render("{{ 'abcdef'[1:-1] }} {{ 'abc'[::-1] }} {{ [1, 2, 3][-1] }}"), "bcde cba 3");
  EXPECT_EQ(Render("{{ '42' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }} {{ 2.5 | round }}"),
            "43 0 2.5 2.0");
  EXPECT_EQ(Render("{{ 'x' is string }} {{ 3 is odd }} {{ none is none }} {{ 'a' in 'cat' }}"),
            "True True True True");
  EXPECT_EQ(Render("{{ 'héllo wörld' | title }} {{ 'ab' * 2 }} {{ 1 ~ 'x' }}"),
            "Héllo Wörld abab 1x");
}

TEST(Jinja, MacrosAndRaiseException) {
  EXPECT_EQ(
      Render("{% macro f(a, b='B') -%}[{{ a }}{{ b }}]{%- endmacro %}{{ f(1) }}{{ f(2, b=3) }}"),
      "[1B][23]");
}

TEST(Jinja, UnsupportedConstructsFailAtParseNamingThem) {
  auto error = [](const std::string& source) {
    auto t = Template::Parse(source, "t");
    return t.ok() ? std::string("parsed") : t.status().message();
  };
  EXPECT_NE(error("{% include 'x' %}").find("unsupported statement '{% include %}'"),
            std::string::npos);
  EXPECT_NE(error("{{ x | pprint }}").find("unsupported filter 'pprint'"), std::string::npos);
  EXPECT_NE(error("{{ x is sameasx }}").find("unsupported test 'sameasx'"), std::string::npos);
  EXPECT_NE(error("{{ x.append(1) }}").find("unsupported method 'append()'"), std::string::npos);
  EXPECT_NE(error("{{ lipsum() }}").find("unsupported function 'lipsum()'"), std::string::npos);
  EXPECT_NE(error("line\n{% if %}").find("line 2"), std::string::npos);
  EXPECT_NE(error("{% for x in y %}").find("expected '{% endfor %}'"), std::string::npos);
}

TEST(Jinja, NumberLiterals) {
  EXPECT_EQ(Render("{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1.5e3 }} {{ [1, 2].0 }}"),
            "31 15 5 1000 1500.0 1");
  // Found by fuzzing: a prefix without digits, and literals beyond 64 bits,
  // are errors, not crashes.
  EXPECT_NE(Render("{{ 0x }}").find("PARSE ERROR"), std::string::npos);
  EXPECT_NE(Render("{{ 99999999999999999999 }}").find("out of range"), std::string::npos);
  EXPECT_NE(Render("{{ 0xFFFFFFFFFFFFFFFFFFFF }}").find("out of range"), std::string::npos);
}

TEST(Jinja, DeepNestingIsAnErrorNotACrash) {
  EXPECT_NE(Render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("nest deeper"),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_NE(Render(ifs).find("nest deeper"), std::string::npos);
  EXPECT_NE(Render("{{ " + std::string(5000, '-') + "1 }}").find("nest deeper"), std::string::npos);
  // A namespace that contains itself prints and fails tojson without recursing forever.
  const std::string self = "{% set ns = namespace(a=1) %}{% set ns.me = ns %}";
  EXPECT_NE(Render(self + "{{ ns }}").find("..."), std::string::npos);
  EXPECT_NE(Render(self + "{{ ns | tojson }}").find("nests too deeply"), std::string::npos);
}

// str.split() with no arguments read past its words (the default maxsplit
// overflowed) and aborted the process.
TEST(Jinja, SplitWithoutArgumentsSplitsOnWhitespaceRuns) {
  EXPECT_EQ(Render("{{ ' a b  c\t\nd '.split() }}"), "['a', 'b', 'c', 'd']");
  EXPECT_EQ(Render("{{ 'a b c'.rsplit() }} {{ ''.split() }} {{ 'a b c'.split(None, 1) }}"),
            "['a', 'b', 'c'] [] ['a', 'b c']");
}

// Integers past 64 bits are errors, not wrapped numbers (Python's are exact),
// and widths past kMaxRepetition are errors, not terabyte allocations.
TEST(Jinja, ArithmeticPast64BitsAndHugeWidthsAreErrors) {
  EXPECT_EQ(Render("{{ 2 ** 62 }} {{ (-1) ** 65 }} {{ 1 ** 1000 }} {{ 0 ** 0 }} {{ 3 ** 3 }}"),
            "4611686018427387904 -1 1 1 27");
  for (const char* t : {"{{ 2 ** 64 }}", "{{ 10 ** 20 }}", "{{ 9223372036854775807 + 1 }}",
                        "{{ -9223372036854775807 - 2 }}", "{{ 4611686018427387904 * 2 }}"}) {
    EXPECT_NE(Render(t).find("integer overflow"), std::string::npos) << t << ": " << Render(t);
  }
  EXPECT_NE(Render("{{ 0 ** -1 }}").find("negative power"), std::string::npos);
  EXPECT_NE(Render("{{ 'a' | center(2 ** 40) }}").find("too large"), std::string::npos);
  EXPECT_NE(Render("{{ 'a\nb' | indent(2 ** 40) }}").find("too large"), std::string::npos);
  EXPECT_NE(Render("{{ [1] | tojson(indent=2 ** 40) }}").find("too large"), std::string::npos);
  EXPECT_EQ(Render("{{ 'ab' | center(6) }}|{{ 'a\nb' | indent(2) }}"), "  ab  |a\n  b");
}

TEST(Jinja, RuntimeErrorsNameTheLine) {
  const std::string r = Render("a\n{{ x.y.z }}");
  EXPECT_NE(r.find("line 2"), std::string::npos) << r;
  EXPECT_NE(r.find("undefined"), std::string::npos) << r;
  EXPECT_NE(Render("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
}

}  // namespace
}  // namespace failsafe::jinja
