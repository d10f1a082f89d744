// Typed reads of one field of a JSON request object. Each returns nullopt when the field is
// absent or null, and throws ApiError(400) naming the field when its JSON type is wrong (a
// string where a number belongs). Ranges are not checked here: SamplingParams go through
// validate() (include/peregrine/engine_types.h), the rest through the request's own checks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/openai/json.h"

namespace peregrine::server {

// "a string", "an integer", ... for messages.
const char* json_type_name(const Json& v);

// The field's value, or null when it is absent or JSON null.
const Json* json_field(const Json& body, const char* key);

std::optional<double> get_number(const Json& body, const char* key);  // finite
std::optional<int64_t> get_int(const Json& body, const char* key);    // 3 and 3.0 alike
std::optional<bool> get_bool(const Json& body, const char* key);
std::optional<std::string> get_string(const Json& body, const char* key);

// `v` (an array) as token ids 0..INT32_MAX; `param` names the field in errors.
std::vector<int32_t> get_token_ids(const Json& v, const char* param);

// An int64 as an int, saturated (a larger value stays out of any range an int field allows).
int saturate_int(int64_t v);

}  // namespace peregrine::server
