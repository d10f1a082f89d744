// The Jinja interpreter piece by piece: expressions, filters, tests, loops, macros, whitespace
// control, errors (with line and column) and the limits that bound a hostile template.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "template/chat_template.h"
#include "template/jinja.h"

namespace peregrine::jinja {
namespace {

std::string render(const std::string& src, const std::string& ctx_json = "{}", const RenderLimits& limits = {}) {
    Template t(src, "t");
    Context ctx;
    const auto vars = nlohmann::ordered_json::parse(ctx_json);
    for (const auto& [k, v] : vars.items()) ctx.set_json(k, v);
    return t.render(ctx, limits);
}

std::string error_of(const std::string& src, const std::string& ctx_json = "{}", const RenderLimits& limits = {}) {
    try {
        render(src, ctx_json, limits);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(JinjaExpr, Arithmetic) {
    EXPECT_EQ(render("{{ 1 + 2 * 3 }}"), "7");
    EXPECT_EQ(render("{{ (1 + 2) * 3 }}"), "9");
    EXPECT_EQ(render("{{ 7 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}"), "3.5|3|-4|1|2");
    EXPECT_EQ(render("{{ 4 / 2 }}|{{ 2 ** 10 }}|{{ 1.5 + 1 }}|{{ 0.1 + 0.2 }}"), "2.0|1024|2.5|0.30000000000000004");
    EXPECT_EQ(render("{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ 'a' ~ 1 ~ none }}"), "ababab|[1, 1]|a1None");
    EXPECT_EQ(render("{{ -3 }}|{{ - 3 + 1 }}|{{ 1e3 }}|{{ 1e20 }}|{{ 1e-7 }}"), "-3|-2|1000.0|1e+20|1e-07");
    EXPECT_EQ(render("{{ 'a' + 'b' }}|{{ [1, 2] + [3] }}"), "ab|[1, 2, 3]");
}

TEST(JinjaExpr, ComparisonsAndLogic) {
    EXPECT_EQ(render("{{ 1 < 2 < 3 }}|{{ 1 < 3 < 2 }}|{{ 1 == 1.0 }}|{{ 'a' != 'b' }}"), "True|False|True|True");
    EXPECT_EQ(render("{{ 'b' in 'abc' }}|{{ 2 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 3 not in [1] }}"),
              "True|True|True|True");
    EXPECT_EQ(render("{{ none or 'x' }}|{{ 0 and 1 }}|{{ not [] }}|{{ 'y' if 0 else 'n' }}|{{ 'y' if 1 }}"),
              "x|0|True|n|y");
    EXPECT_EQ(render("{{ x in undefined_thing }}|{{ [] == [] }}|{{ {'a': [1]} == {'a': [1]} }}"), "False|True|True");
}

TEST(JinjaExpr, LiteralsAndAccess) {
    EXPECT_EQ(render("{{ [1, 'a', none, true, 1.0] }}"), "[1, 'a', None, True, 1.0]");
    EXPECT_EQ(render("{{ {'a': 1, \"b\": 'it\\'s'} }}"), "{'a': 1, 'b': \"it's\"}");
    EXPECT_EQ(render("{{ (1, 2) }}|{{ () }}|{{ 'x' 'y' }}"), "[1, 2]|[]|xy");
    EXPECT_EQ(render("{{ m.role }}|{{ m['content'] }}|{{ m.missing }}|{{ l[0] }}|{{ l[-1] }}|{{ l[9] }}|{{ l.1 }}",
                     R"({"m": {"role": "user", "content": "hi"}, "l": [1, 2, 3]})"),
              "user|hi||1|3||2");
    EXPECT_EQ(render("{{ l[1:] }}|{{ l[:-1] }}|{{ l[::-1] }}|{{ l[::2] }}|{{ s[1:3] }}|{{ s[::-1] }}",
                     R"({"l": [1, 2, 3], "s": "héllo"})"),
              "[2, 3]|[1, 2]|[3, 2, 1]|[1, 3]|él|olléh");
    EXPECT_EQ(render("{{ '\\n\\t\\u00e9\\x41' }}"), "\n\té\x41");
}

TEST(JinjaExpr, UndefinedIsLenient) {
    EXPECT_EQ(render("[{{ nope }}][{{ nope.deeper }}][{% for x in nope %}x{% endfor %}][{{ nope|length }}]"),
              "[][][][0]");
    EXPECT_EQ(
        render("{{ nope is defined }}|{{ nope is undefined }}|{{ nope|default('d') }}|{{ ''|default('d', true) }}"),
        "False|True|d|d");
    EXPECT_EQ(render("{% if nope %}y{% else %}n{% endif %}"), "n");
}

TEST(JinjaFilters, Strings) {
    EXPECT_EQ(render("{{ '  a b  '|trim }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ 'hello world'|title }}"),
              "a b|ABC|abc|Hello World");
    EXPECT_EQ(render("{{ 'hello'|capitalize }}|{{ 'a-b'|replace('-', '+') }}|{{ 'aaa'|replace('a', 'b', 2) }}"),
              "Hello|a+b|bba");
    EXPECT_EQ(render("{{ 'ünï'|upper }}|{{ 'ÀÉ'|lower }}|{{ 'héllo'|length }}|{{ 'a b  c'|wordcount }}"), "ÜNÏ|àé|5|3");
    EXPECT_EQ(render("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
    EXPECT_EQ(render("{{ '<a href=\"x\">'|e }}|{{ '%s=%d'|format('x', 3) }}|{{ '%s-%s' % ('a', 'b') }}"),
              "&lt;a href=&#34;x&#34;&gt;|x=3|a-b");
    EXPECT_EQ(
        render("{{ '42'|int + 1 }}|{{ 'x'|int(7) }}|{{ '3.5'|float }}|{{ 3.7|int }}|{{ 2.5|round }}|{{ -3|abs }}"),
        "43|7|3.5|3|2.0|3");
    EXPECT_EQ(render("{{ 3.5|round }}|{{ 2.567|round(2) }}|{{ 2.1|round(method='ceil') }}|{{ 3|round }}"),
              "4.0|2.57|3.0|3");
}

TEST(JinjaFilters, Lists) {
    const std::string ctx = R"({"xs": [{"n": "b", "k": 2}, {"n": "a", "k": 1}, {"n": "c"}]})";
    EXPECT_EQ(render("{{ xs|map(attribute='n')|join(', ') }}", ctx), "b, a, c");
    EXPECT_EQ(render("{{ xs|selectattr('k')|map(attribute='n')|list }}", ctx), "['b', 'a']");
    EXPECT_EQ(render("{{ xs|rejectattr('k', 'defined')|map(attribute='n')|first }}", ctx), "c");
    EXPECT_EQ(render("{{ xs|selectattr('n', 'equalto', 'a')|list|length }}", ctx), "1");
    EXPECT_EQ(render("{{ xs|sort(attribute='n')|map(attribute='n')|join }}", ctx), "abc");
    EXPECT_EQ(render("{{ [3, 1, 2]|sort }}|{{ [3, 1, 2]|sort(reverse=true) }}|{{ ['b', 'A', 'a']|unique|list }}"),
              "[1, 2, 3]|[3, 2, 1]|['b', 'A']");
    EXPECT_EQ(
        render("{{ [1, 2, 3]|first }}|{{ [1, 2, 3]|last }}|{{ [1, 2, 3]|sum }}|{{ [1, 5, 2]|max }}|{{ [4, 2]|min }}"),
        "1|3|6|5|2");
    EXPECT_EQ(render("{{ [1, 2, 3, 4, 5]|batch(2)|list }}|{{ [1, 2, 3]|reverse|list }}|{{ 'ab'|list }}"),
              "[[1, 2], [3, 4], [5]]|[3, 2, 1]|['a', 'b']");
    EXPECT_EQ(render("{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3, 4]|reject('even')|list }}"), "[1, 3]|[1, 3]");
    EXPECT_EQ(render("{{ ['a', 'b']|map('upper')|join('-') }}"), "A-B");
}

TEST(JinjaFilters, Dicts) {
    const std::string ctx = R"({"d": {"b": 1, "a": 2, "C": 3}})";
    EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=2;C=3;");
    EXPECT_EQ(render("{% for k, v in d|dictsort %}{{ k }}{% endfor %}", ctx), "abC");
    EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}|{{ d|length }}|{{ d.get('a') }}|{{ d.get('z', 0) }}", ctx),
              "baC|3|2|0");
    EXPECT_EQ(render("{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.items()|list }}", ctx),
              "['b', 'a', 'C']|[1, 2, 3]|[['b', 1], ['a', 2], ['C', 3]]");
}

TEST(JinjaFilters, ToJsonLikePython) {
    const std::string ctx = R"({"v": {"b": [1, 2.5, true, null], "a": "é\"\n<tag>"}})";
    EXPECT_EQ(render("{{ v|tojson }}", ctx), R"({"b": [1, 2.5, true, null], "a": "é\"\n<tag>"})");
    EXPECT_EQ(render("{{ v|tojson(indent=2) }}", ctx),
              "{\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"a\": \"é\\\"\\n<tag>\"\n}");
    EXPECT_EQ(render("{{ v|tojson(sort_keys=true, ensure_ascii=true) }}", ctx),
              R"({"a": "\u00e9\"\n<tag>", "b": [1, 2.5, true, null]})");
    EXPECT_EQ(render("{{ v|tojson(separators=(',', ':')) }}", ctx), R"({"b":[1,2.5,true,null],"a":"é\"\n<tag>"})");
    EXPECT_EQ(render("{{ []|tojson(indent=2) }}|{{ {}|tojson }}|{{ 1.0|tojson }}|{{ 'x'|tojson }}"), "[]|{}|1.0|\"x\"");
}

TEST(JinjaMethods, StringsListsDicts) {
    EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}"),
              "['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']");
    EXPECT_EQ(
        render("{{ 'xxhixx'.strip('x') }}|{{ '  hi'.lstrip() }}|{{ 'hi\\n'.rstrip() }}|{{ 'abc'.startswith('a') }}"),
        "hi|hi|hi|True");
    EXPECT_EQ(render("{{ 'abc'.endswith(('x', 'c')) }}|{{ 'hello'.find('l') }}|{{ 'a-b'.replace('-', '') }}"),
              "True|2|ab");
    EXPECT_EQ(
        render("{{ 'Hi {}, {name}'.format('a', name='b') }}|{{ ', '.join(['a', 'b']) }}|{{ 'hi there'.title() }}"),
        "Hi a, b|a, b|Hi There");
    EXPECT_EQ(render("{% set l = [1] %}{% do l.append(2) %}{{ l }}|{{ l.pop() }}|{{ l }}"), "[1, 2]|2|[1]");
    EXPECT_EQ(render("{% set d = {} %}{% do d.update({'a': 1}) %}{{ d }}"), "{'a': 1}");
}

TEST(JinjaStatements, IfElifElse) {
    const std::string src = "{% if x > 2 %}big{% elif x > 0 %}small{% else %}none{% endif %}";
    EXPECT_EQ(render(src, R"({"x": 5})"), "big");
    EXPECT_EQ(render(src, R"({"x": 1})"), "small");
    EXPECT_EQ(render(src, R"({"x": 0})"), "none");
}

TEST(JinjaStatements, ForLoops) {
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
                     "{{ loop.last }}{{ loop.length }};{% endfor %}"),
              "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
    EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
    EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"), "2242");
    EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}"), "-2;1-3;2-;");
    EXPECT_EQ(render("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}"
                     "{% endif %}{{ x }}{% endfor %}"),
              "02");
    EXPECT_EQ(
        render("{% for x in range(1, 7, 2) %}{{ x }}{% endfor %}|{% for x in range(3, 0, -1) %}{{ x }}{% endfor %}"),
        "135|321");
    EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.cycle('o', 'e') }}{{ x }}{% endfor %}"), "oaeb");
}

TEST(JinjaStatements, SetScopingAndNamespace) {
    EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
    EXPECT_EQ(
        render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
        "4");
    EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
    EXPECT_EQ(render("{% set block %}  hi {{ 1 }}{% endset %}[{{ block }}]"), "[  hi 1]");
    EXPECT_EQ(render("{% set block | upper %}hi{% endset %}{{ block }}"), "HI");
    EXPECT_EQ(render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}"), "3");
}

TEST(JinjaStatements, MacrosAndCall) {
    EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                     "{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}"),
              "Hi a! Hi b? Hi c.");
    EXPECT_EQ(render("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inside{% endcall %}"),
              "<inside>");
    EXPECT_EQ(render("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                     "{% call(v) each([1, 2]) %}[{{ v }}]{% endcall %}"),
              "[1][2]");
    EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
    EXPECT_EQ(render("{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}"), "global");
    EXPECT_EQ(render("{% macro m(a) %}[{{ a }}]{{ varargs }}{% endmacro %}{{ m() }}{{ m(1, 2) }}"), "[][][1][2]");
    EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
}

TEST(JinjaWhitespace, TrimAndLstripBlocks) {
    // trim_blocks and lstrip_blocks are on, as transformers renders chat templates
    EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
    EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
    EXPECT_EQ(render("a  {{- 'x' -}}  c"), "axc");
    EXPECT_EQ(render("a {# comment #} b\n  {#- c2 -#}\n d"), "a  bd");
    EXPECT_EQ(render("x  {%+ if true %}y{% endif %}"), "x  y");
    EXPECT_EQ(render("{% raw %}{{ not_jinja }}{% endraw %}"), "{{ not_jinja }}");
    EXPECT_EQ(render("line\r\nnext\n"), "line\nnext");
    EXPECT_EQ(render("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");
}

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
    EXPECT_EQ(error_of("line1\n{% if x %}\nno end"),
              "t:2:1: syntax error: 'if' block is never closed (expected 'endif')");
    EXPECT_EQ(error_of("{{ 1 + }}"), "t:1:8: syntax error: expected an expression, got '}}'");
    EXPECT_EQ(error_of("ok\n  {% frobnicate %}"), "t:2:6: syntax error: unknown tag 'frobnicate'");
    EXPECT_EQ(error_of("{{ 'unterminated }}"), "t:1:4: syntax error: unterminated string literal");
    EXPECT_EQ(error_of("{% endif %}"), "t:1:4: syntax error: unexpected 'endif' (no block open that it could close)");
    EXPECT_EQ(error_of("{{ x"), "t:1:1: syntax error: missing '}}'");
}

TEST(JinjaErrors, RuntimeErrorsNameLineAndColumn) {
    EXPECT_EQ(error_of("\n\n  {{ 1 / 0 }}"), "t:3:8: division by zero");
    EXPECT_EQ(error_of("{{ x|nosuchfilter }}"), "t:1:6: unknown filter 'nosuchfilter'");
    EXPECT_EQ(error_of("{{ strftime_now('%Y') }}"), "t:1:4: 'strftime_now' is undefined");
    EXPECT_EQ(error_of("{{ 1 + 'a' if false else [] - 1 }}"), "t:1:29: unsupported operand types for -: list and int");
}

TEST(JinjaErrors, RaiseExceptionCarriesTheMessage) {
    try {
        render("{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}");
        FAIL() << "no exception";
    } catch (const RaisedError& e) {
        EXPECT_STREQ(e.what(), "Conversation roles must alternate user/assistant/user/assistant/...");
    }
}

TEST(JinjaLimits, HostileTemplatesAreBounded) {
    RenderLimits small;
    small.max_output_bytes = 1 << 20;
    small.max_work = 1'000'000;
    EXPECT_NE(error_of("{% for i in range(10**12) %}x{% endfor %}", "{}", small).find("too long"), std::string::npos);
    EXPECT_NE(error_of("{{ 'x' * 10**12 }}", "{}", small).find("exceeds the limit"), std::string::npos);
    EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("nesting deeper"), std::string::npos);
    EXPECT_NE(error_of("{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}",
                       "{}", small)
                  .find("exceeds the limit"),
              std::string::npos);
    EXPECT_NE(error_of("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
                       "{% endfor %}{% endfor %}{% endfor %}",
                       "{}", small)
                  .find("too much work"),
              std::string::npos);
    // Deep nesting in the source is a syntax error, not a stack overflow.
    EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested too deeply"),
              std::string::npos);
    EXPECT_NE(error_of("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}").find("nested too deeply"),
              std::string::npos);
}

TEST(JinjaLimits, HugeNumbersAreNotACrashOrAHang) {
    // `x.N` with N past int64 once threw std::out_of_range out of the parser (found by the fuzzer).
    EXPECT_NE(error_of("{{ messages.99999999999999999999999 }}").find("out of range"), std::string::npos);
    // An integer literal past int64 is a float, and past a double's range infinity, as before.
    EXPECT_EQ(render("{{ 100000000000000000000 > 1 }}"), "True");
    EXPECT_EQ(render("{{ " + std::string(400, '9') + " > 1 }}"), "True");
    // '%d' of a float past int64 is its digits (as Python prints it); of inf an error.
    EXPECT_EQ(render("{{ '%d' % 1e20 }}|{{ '%d' % -2.5 }}"), "100000000000000000000|-2");
    EXPECT_NE(error_of("{{ '%d' % (1e308 * 10) }}").find("cannot convert"), std::string::npos);
    EXPECT_NE(error_of("{{ [1, 2]|batch(1e30) }}").find("out of the integer range"), std::string::npos);
    // An empty list or string times a huge count is empty at once (it once looped the count).
    EXPECT_EQ(render("{{ ([] * 7744**3)|length }}|{{ '' * 7744**3 }}|{{ 7744**3 * [] }}"), "0||[]");
}

TEST(JinjaLimits, CyclesAndDeepValuesDoNotCrash) {
    // A list that contains itself prints with an error, and is freed when the render ends.
    EXPECT_NE(error_of("{% set l = [] %}{% do l.append(l) %}{{ l }}").find("nested too deeply"), std::string::npos);
    EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns.self.self is mapping }}"), "True");
    // A list nested 100000 levels deep is built, then freed without recursion.
    EXPECT_EQ(render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}ok"),
              "ok");
}

TEST(JinjaContext, ValuesAreCopiedPerRender) {
    Template t("{% do xs.append(1) %}{{ xs|length }}", "t");
    Context ctx;
    ctx.set_json("xs", nlohmann::ordered_json::array());
    EXPECT_EQ(t.render(ctx), "1");
    EXPECT_EQ(t.render(ctx), "1");
}

TEST(JinjaContext, CallerDefinedFunctions) {
    Template t("{{ strftime_now('%Y-%m-%d %b') }}|{{ twice(21) }}", "t");
    Context ctx;
    define_strftime_now(ctx, [] {
        std::tm tm{};
        tm.tm_year = 124;
        tm.tm_mon = 6;
        tm.tm_mday = 26;
        return tm;
    });
    ctx.set_function("twice", [](CallArgs& a) { return Value(a.args.at(0).as_int() * 2); });
    EXPECT_EQ(t.render(ctx), "2024-07-26 Jul|42");
}

}  // namespace
}  // namespace peregrine::jinja

namespace peregrine {
namespace {

TEST(ChatTemplate, TokenizerConfigStringOrList) {
    auto cfg = nlohmann::ordered_json::parse(R"({
        "bos_token": {"content": "<s>", "lstrip": false},
        "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "tools"},
                          {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"}]
    })");
    const ChatTemplate t = ChatTemplate::from_tokenizer_config_json(cfg, "cfg");
    ChatInputs in;
    in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
    EXPECT_EQ(t.render(in), "<s>hi</s>");
    in.bos_token = "[B]";
    EXPECT_EQ(t.render(in), "[B]hi</s>");
    cfg["chat_template"] = "{{ messages|length }}{{ add_generation_prompt }}{{ tools is defined }}";
    EXPECT_EQ(ChatTemplate::from_tokenizer_config_json(cfg, "cfg").render(in), "1FalseFalse");
    in.tools = nlohmann::ordered_json::array();
    in.add_generation_prompt = true;
    EXPECT_EQ(ChatTemplate::from_tokenizer_config_json(cfg, "cfg").render(in), "1TrueTrue");
}

TEST(ChatTemplate, MissingTemplateIsAClearError) {
    try {
        ChatTemplate::from_tokenizer_config_json(nlohmann::ordered_json::parse(R"({"eos_token": "x"})"), "cfg.json");
        FAIL();
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "cfg.json: no 'chat_template' field");
    }
}

}  // namespace
}  // namespace peregrine
