// libFuzzer target for the Jinja parser and renderer: the input is a template, rendered against a
// conversation with a system prompt, a tool call and tools. Any input must either render or fail
// with peregrine::Error, within the limits; a crash, sanitizer report, leak or hang is a bug.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

#include "core/error.h"
#include "template/jinja.h"

namespace {

using peregrine::jinja::CallArgs;
using peregrine::jinja::Context;
using peregrine::jinja::RenderLimits;
using peregrine::jinja::Template;
using peregrine::jinja::Value;

const char* const kContext = R"({
  "messages": [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "What's 2+2?\n\"JSON\" {like: this} — ünïcödé 🚀 <tag> {{ not_jinja }}"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5, true, null]}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp_c\": 18}"},
    {"role": "assistant", "content": "<think>hmm</think>It is 18 degrees."}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["a", "b"]},
    "days": {"type": "array", "items": {"type": "integer"}}}, "required": ["city"]}}}],
  "add_generation_prompt": true,
  "bos_token": "<s>",
  "eos_token": "</s>",
  "enable_thinking": false
})";

const Context& context() {
    static const Context ctx = [] {
        Context c;
        const auto j = nlohmann::ordered_json::parse(kContext);
        for (const auto& [k, v] : j.items()) c.set_json(k, v);
        c.set_function("strftime_now", [](CallArgs& a) -> Value {
            if (a.args.empty() || !a.args[0].is_string()) return Value("");
            std::tm t{};
            t.tm_year = 126;
            t.tm_mon = 10;
            t.tm_mday = 21;
            char buf[256];
            const std::string fmt = a.args[0].as_string().substr(0, 64);
            return Value(std::string(buf, std::strftime(buf, sizeof buf, fmt.c_str(), &t)));
        });
        return c;
    }();
    return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size > 64 * 1024) return 0;
    RenderLimits limits;  // smaller than the defaults, so that each input runs fast
    limits.max_output_bytes = 1 << 20;
    limits.max_work = 200'000;
    try {
        const Template t(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
        (void)t.render(context(), limits);
    } catch (const peregrine::Error&) {
    }
    return 0;
}
