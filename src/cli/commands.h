// Subcommands of the `peregrine` binary.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace peregrine::cli {

// The command line the binary was started with (argv[0] first): `serve --data-parallel-size`
// starts its replicas with it.
const std::vector<std::string>& original_args();

// Registers the subcommand on `app`; returns the function that runs it (exit code).
std::function<int()> add_generate(CLI::App& app);
std::function<int()> add_tokenize(CLI::App& app);
std::function<int()> add_detokenize(CLI::App& app);
std::function<int()> add_chat_template(CLI::App& app);
std::function<int()> add_serve(CLI::App& app);
std::function<int()> add_router(CLI::App& app);
std::function<int()> add_bench(CLI::App& app);  // `bench serve`, `bench throughput`, `bench latency`
// `bench throughput` and `bench latency` under the `bench` group; -1 when neither was given.
std::function<int()> add_bench_offline(CLI::App* group);

}  // namespace peregrine::cli
