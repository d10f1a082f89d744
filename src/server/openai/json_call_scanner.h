// Tool calls read out of JSON text while it is still being written, so that a call's arguments
// can stream as the model produces them. The text is one JSON value in one of three shapes:
//
//   Call       {"name": "f", "arguments": {...}}      ("parameters" for "arguments" too; the
//                                                       arguments may also be an object's JSON
//                                                       text in a string; no arguments: {})
//   Calls      [Call, Call, ...]
//   Arguments  {...}                                  (the arguments of a call named already)
//
// A call is *ready* once its name is known (and allowed) and its arguments have begun, or it is
// complete. The scanner *commits* at the first ready call (holding calls: when the whole value
// is done and holds one call): from then on the value is calls whatever follows, since what was
// streamed cannot be taken back. Before that, anything that is not a call makes the whole value
// Invalid (its text is then content). After it, a bad later call is dropped with the rest of the
// value, and text that ends first leaves the calls as written (the answer ran out of tokens).
// Decisions depend on the text only, never on how it was cut into pieces.
//
// A call's `arguments` grow by appending only: the arguments value's text with the whitespace
// outside strings left out (a string's arguments appear whole, re-serialized, once it closes).
// What went out of it can therefore never change, and the pieces streamed join into the final
// arguments exactly.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine::server {

struct ScannedCall {
    std::string name;
    std::string arguments;  // see above; "{}" for a complete call without arguments
    bool ready = false;
    bool complete = false;  // its object closed and parsed as JSON
};

class JsonCallScanner {
  public:
    enum class Shape { Call, Calls, Arguments };
    enum class State { Scanning, Done, Invalid };

    // `names`: the allowed names (empty: any). `hold`: commit only to a whole value of one call
    // (parallel_tool_calls false). `name`: the call's name for Shape::Arguments.
    JsonCallScanner(Shape shape, const std::vector<std::string>* names, bool hold, std::string name = {});

    // `text` starts with the value's first character and extends the text of the previous call.
    // `final`: no more text comes (a value still open ends here).
    void scan(std::string_view text, bool final);

    State state() const { return state_; }
    bool committed() const { return committed_; }
    // Done: one past the value's last character scanned.
    size_t end() const { return i_; }
    // Whether the text scanned so far ends inside a JSON string.
    bool in_string() const { return in_string_; }
    const std::vector<ScannedCall>& calls() const { return calls_; }

  private:
    // Where the call object's next character belongs.
    enum class Slot { Key, KeyString, Colon, Value, Next };

    void step(std::string_view text, size_t at);
    void skip(char c);  // dropping: strings and nesting only, to the value's end
    void bracket(std::string_view text, size_t at, char c);
    void call_level(size_t at, char c);
    void value_begins(size_t at, char c);
    void value_ends(std::string_view text, size_t end);
    void call_ends(std::string_view text, size_t end);
    void done();
    void bad();  // not calls (Invalid) or, once committed, the rest of the value is dropped
    void update_ready();
    bool allowed(const std::string& name) const;

    const Shape shape_;
    const std::vector<std::string>* names_;
    const bool hold_;
    std::vector<ScannedCall> calls_;
    State state_ = State::Scanning;
    bool committed_ = false;
    bool dropping_ = false;

    // The lexer: the next character, nesting, strings.
    size_t i_ = 0;
    int depth_ = 0;
    bool in_string_ = false;
    bool escape_ = false;
    // The call object being read (at depth call_depth_): where it began, its slot, its last
    // key's text (quotes included), the value being read at its level.
    int call_depth_ = 1;
    bool in_call_ = false;
    size_t call_begin_ = 0;
    Slot slot_ = Slot::Key;
    size_t key_begin_ = 0;
    std::string key_;
    bool in_value_ = false;
    bool scalar_ = false;  // the value is a number or literal (it ends at ws, ',', '}')
    size_t value_begin_ = 0;
    bool in_args_ = false;                        // the value is the arguments object: its text goes to `arguments`
    bool args_string_ = false;                    // the value is the arguments as a string of JSON text
    bool args_started_ = false;                   // the call's arguments have begun (a string's: parsed)
    bool name_seen_ = false, args_seen_ = false;  // a second "name" or arguments key is refused
};

}  // namespace peregrine::server
