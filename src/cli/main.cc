// `peregrine`: the command-line entry point.
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "peregrine/version.h"

namespace {
std::vector<std::string> g_args;
}

const std::vector<std::string>& peregrine::cli::original_args() {
    return g_args;
}

int main(int argc, char** argv) {
    g_args.assign(argv, argv + argc);
    CLI::App app{"Peregrine: an LLM inference engine"};
    app.require_subcommand(0, 1);
    app.option_defaults()->always_capture_default();  // --help shows every option's default
    bool show_version = false;
    app.add_flag("--version", show_version, "Print the version and the backends compiled in");
    auto run_generate = peregrine::cli::add_generate(app);
    auto run_tokenize = peregrine::cli::add_tokenize(app);
    auto run_detokenize = peregrine::cli::add_detokenize(app);
    auto run_chat_template = peregrine::cli::add_chat_template(app);
    auto run_serve = peregrine::cli::add_serve(app);
    auto run_router = peregrine::cli::add_router(app);
    auto run_bench = peregrine::cli::add_bench(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    if (show_version) {
        std::cout << peregrine::build_info();
        return 0;
    }
    try {
        if (app.got_subcommand("generate")) return run_generate();
        if (app.got_subcommand("tokenize")) return run_tokenize();
        if (app.got_subcommand("detokenize")) return run_detokenize();
        if (app.got_subcommand("chat-template")) return run_chat_template();
        if (app.got_subcommand("serve")) return run_serve();
        if (app.got_subcommand("router")) return run_router();
        if (app.got_subcommand("bench")) return run_bench();
        std::cout << app.help();
        return 1;
    } catch (const peregrine::Error& e) {
        std::fflush(stdout);
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    }
}
