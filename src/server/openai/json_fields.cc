#include "server/openai/json_fields.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace peregrine::server {

namespace {

bool integral(const Json& v) {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15;
}

int64_t as_int64(const Json& v) {
    if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                              : static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    return static_cast<int64_t>(v.get<double>());
}

}  // namespace

const char* json_type_name(const Json& v) {
    switch (v.type()) {
        case Json::value_t::null:
            return "null";
        case Json::value_t::boolean:
            return "a boolean";
        case Json::value_t::string:
            return "a string";
        case Json::value_t::array:
            return "an array";
        case Json::value_t::object:
            return "an object";
        case Json::value_t::number_float:
            return "a number";
        default:
            return "an integer";
    }
}

const Json* json_field(const Json& body, const char* key) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
}

std::optional<double> get_number(const Json& body, const char* key) {
    const Json* v = json_field(body, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad_param(key, "'", key, "' must be a number, got ", json_type_name(*v));
    const double d = v->get<double>();
    if (!std::isfinite(d)) bad_param(key, "'", key, "' must be finite");
    return d;
}

std::optional<int64_t> get_int(const Json& body, const char* key) {
    const Json* v = json_field(body, key);
    if (!v) return std::nullopt;
    if (!integral(*v)) bad_param(key, "'", key, "' must be an integer, got ", json_type_name(*v));
    return as_int64(*v);
}

std::optional<bool> get_bool(const Json& body, const char* key) {
    const Json* v = json_field(body, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad_param(key, "'", key, "' must be a boolean, got ", json_type_name(*v));
    return v->get<bool>();
}

std::optional<std::string> get_string(const Json& body, const char* key) {
    const Json* v = json_field(body, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad_param(key, "'", key, "' must be a string, got ", json_type_name(*v));
    return v->get<std::string>();
}

std::vector<int32_t> get_token_ids(const Json& v, const char* param) {
    std::vector<int32_t> ids;
    ids.reserve(v.size());
    for (const Json& t : v) {
        if (!integral(t)) bad_param(param, "'", param, "' token ids must be integers, got ", json_type_name(t));
        const int64_t id = as_int64(t);
        if (id < 0 || id > std::numeric_limits<int32_t>::max())
            bad_param(param, "'", param, "' token id ", id, " is out of range");
        ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
}

int saturate_int(int64_t v) {
    return static_cast<int>(std::clamp<int64_t>(v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

}  // namespace peregrine::server
