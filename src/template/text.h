// String helpers for the Jinja builtins: UTF-8 code points, Python-style case mapping and
// whitespace.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace peregrine::jinja::text {

// The code points of `s` as byte ranges (an invalid byte is one "character" of its own).
std::vector<std::string_view> chars(std::string_view s);
size_t num_chars(std::string_view s);
bool is_ascii(std::string_view s);

// Python str.upper() / str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic.
std::string upper(std::string_view s);
std::string lower(std::string_view s);
bool has_cased(std::string_view s, bool want_upper);  // any upper- (or lower-) case letter
// Python str.capitalize(): the first character upper case, the rest lower case.
std::string capitalize(std::string_view s);
// Python str.title(): upper case after any non-letter, lower case elsewhere.
std::string title(std::string_view s);
// Jinja's `title` filter: words start after '-', whitespace, '(', '{', '[' or '<'.
std::string jinja_title(std::string_view s);

bool is_py_space(char c);
// Python str.strip([chars]); `chars` null: whitespace.
std::string_view strip(std::string_view s, const std::string* chars, bool left, bool right);
// Python str.split(sep=None, maxsplit=-1) and rsplit.
std::vector<std::string> split(std::string_view s, const std::string* sep, long maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, long maxsplit);
// Python str.replace(old, new, count=-1).
std::string replace(std::string_view s, std::string_view from, std::string_view to, long count);

}  // namespace peregrine::jinja::text
