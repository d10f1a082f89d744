#include "server/openai/json.h"

#include "core/error.h"
#include "server/api_error.h"

namespace peregrine::server {

// Nesting is bounded: deeper values would recurse through every later conversion.
constexpr int kMaxJsonDepth = 64;

Json parse_json_object(const std::string& text, const char* what) {
    if (text.empty()) throw ApiError(400, str_cat("the ", what, " is empty; expected a JSON object"));
    auto depth_limit = [](int depth, Json::parse_event_t, Json&) {
        if (depth > kMaxJsonDepth)
            throw ApiError(400, str_cat("the request JSON nests deeper than ", kMaxJsonDepth, " levels"));
        return true;
    };
    try {
        Json j = Json::parse(text, depth_limit);
        if (!j.is_object()) throw ApiError(400, str_cat("the ", what, " must be a JSON object"));
        return j;
    } catch (const Json::parse_error& e) {
        throw ApiError(400, str_cat("the ", what, " is not valid JSON: ", e.what()), "", "invalid_json");
    } catch (const Json::exception& e) {
        // out_of_range: a number no double holds (1e309), wherever it is in the body.
        throw ApiError(400, str_cat("the ", what, " cannot be read: ", e.what()), "", "invalid_json");
    }
}

}  // namespace peregrine::server
