// A Jinja2 interpreter for chat templates: parse once, render many times.
//
//   jinja::Template t(source, "Qwen3/chat_template");     // throws Error on a syntax error
//   jinja::Context ctx;
//   ctx.set_json("messages", messages);
//   ctx.set("add_generation_prompt", jinja::Value(true));
//   ctx.set_function("strftime_now", ...);                 // the server defines it; the CLI does not
//   std::string prompt = t.render(ctx);                    // throws Error / RaisedError
//
// Semantics follow Python Jinja2 as transformers configures it (trim_blocks, lstrip_blocks, the
// `tojson` that calls json.dumps with ensure_ascii=False, `raise_exception`), with the lenient
// edges of the @huggingface/jinja reference the fixtures were rendered with: an undefined value is
// falsy, prints as "", iterates as empty and has undefined attributes.
//
// Rendering is bounded (RenderLimits): nesting depth, total work (loop iterations, macro calls,
// items and bytes created) and output size, so no template or input can hang or exhaust a server.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "template/lexer.h"
#include "template/value.h"

namespace peregrine::jinja {

struct Program;

// `raise_exception(msg)` in a template: what() is exactly the template's message.
class RaisedError : public Error {
  public:
    using Error::Error;
};

struct RenderLimits {
    size_t max_output_bytes = size_t{32} << 20;  // the rendered text, and any one string or buffer built on the way
    int max_depth = 400;                         // nested evaluation (expressions, blocks, macro calls)
    uint64_t max_work = 20'000'000;              // loop iterations + calls + list items + created bytes / 64
};

// The variables a template sees. Values set here are copied into each render, so a template that
// mutates a list or a namespace never changes the context.
class Context {
  public:
    void set(const std::string& name, Value v);
    void set_json(const std::string& name, const nlohmann::ordered_json& j);
    // A function callable from the template; it gets the evaluated arguments.
    void set_function(const std::string& name, std::function<Value(CallArgs&)> fn);
    void erase(const std::string& name);

    const std::vector<std::pair<std::string, Value>>& vars() const { return vars_; }

  private:
    std::vector<std::pair<std::string, Value>> vars_;
};

class Template {
  public:
    // Parses `source`; a syntax error throws Error("<name>:<line>:<col>: syntax error: ...").
    explicit Template(std::string source, std::string name = "template", LexOptions options = {});

    // Renders with the variables of `ctx`. Runtime failures throw Error("<name>:<line>:<col>: ...");
    // `raise_exception` throws RaisedError with the template's message.
    std::string render(const Context& ctx, const RenderLimits& limits = {}) const;

    const std::string& name() const { return name_; }
    const std::string& source() const { return source_; }

  private:
    std::string source_;
    std::string name_;
    std::shared_ptr<const Program> program_;
};

}  // namespace peregrine::jinja
