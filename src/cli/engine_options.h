// The flags shared by the commands that run the engine (generate, serve, bench): each sets a
// field of the library's EngineConfig, nothing more.
#pragma once

#include <CLI/CLI.hpp>

#include "peregrine/engine_config.h"

namespace peregrine::cli {

// Adds the engine flags to `cmd`, bound to `config`; a progress line for big models on a
// terminal is set as config.load_progress.
void add_engine_options(CLI::App* cmd, EngineConfig& config);

}  // namespace peregrine::cli
