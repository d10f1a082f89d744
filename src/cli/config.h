// Configuration layers for a subcommand: every option the command line leaves unset comes from
// the environment (PEREGRINE_<NAME>), else from a TOML file (--config FILE), else keeps its default.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine::cli {

// One value of the TOML subset read here: strings, integers, floats, booleans, and arrays of those.
struct TomlValue {
    enum class Kind { String, Integer, Float, Boolean, Array };
    Kind kind = Kind::String;
    std::string text;              // scalars: the string, or the number / boolean as CLI11 reads it
    std::vector<TomlValue> items;  // arrays
};

struct TomlEntry {
    std::string key;
    TomlValue value;
    int line = 0;
};

// Parses top-level `key = value` lines (comments, multi-line arrays; no tables). Errors are
// CLI::ConfigError (exit code 1) naming `source` and the line.
std::vector<TomlEntry> parse_toml(std::string_view text, const std::string& source);

// "api-key" -> "PEREGRINE_API_KEY".
std::string env_var_name(std::string_view long_name, std::string_view prefix = "PEREGRINE_");

// Adds `--config FILE` (or $<prefix>CONFIG) to `cmd`; once `cmd` has parsed its command line, fills
// each option it left unset from the environment, else from the file. Lists in the environment
// are comma-separated. An unknown key or a value of the wrong type is a CLI::ConfigError with
// exit code 1.
void add_config_layers(CLI::App* cmd, std::string env_prefix = "PEREGRINE_");

// What add_config_layers runs after parsing; `config_file` empty = no file.
void apply_config_layers(CLI::App& cmd, const std::string& config_file, const std::string& env_prefix);

}  // namespace peregrine::cli
