// JSON as the OpenAI API reads and writes it: nlohmann's ordered_json (fields keep the order they
// were written in), parsed with a nesting bound and dumped compact with invalid UTF-8 replaced.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace peregrine::server {

using Json = nlohmann::ordered_json;

// Compact, invalid UTF-8 replaced by U+FFFD (a token's piece may hold part of a character).
inline std::string dump(const Json& j) {
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// `text` as a JSON object; ApiError 400 (code invalid_json when it does not parse) naming
// `what` ("request body", "message") when it is empty, not JSON, not an object, or nests deeper
// than 64 levels.
Json parse_json_object(const std::string& text, const char* what);

}  // namespace peregrine::server
