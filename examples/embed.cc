// Peregrine as a library: build an engine, submit two prompts from this thread, read their
// streams. Only the public header include/peregrine/engine.h is used.
//
//   peregrine_example_embed [MODEL]    (default: the embedded stories260K model)
#include <cstdio>
#include <string>
#include <vector>

#include "peregrine/engine.h"
int main(int argc, char** argv) {
    peregrine::EngineConfig config;
    if (argc > 1) config.model = argv[1];
    config.device = "cpu";
    config.max_num_seqs = 8;
    try {
        std::unique_ptr<peregrine::Engine> engine = peregrine::Engine::create(config);

        std::vector<std::shared_ptr<peregrine::RequestStream>> streams;
        for (const std::string prompt : {"Once upon a time", "The little dog"}) {
            peregrine::Request r;
            r.id = "req-" + std::to_string(streams.size());
            r.prompt_ids = engine->tokenize(prompt);
            r.sampling.temperature = 0.0f;  // greedy: the same text every run
            r.sampling.max_tokens = 24;
            streams.push_back(engine->submit(std::move(r)));  // both run in the same steps
        }
        for (auto& stream : streams) {
            std::string text;
            peregrine::RequestOutput out;
            int tokens = 0;
            while (stream->next(out)) {  // blocks until the engine thread has more
                text += out.text;
                tokens += static_cast<int>(out.token_ids.size());
                if (out.usage)
                    std::printf("%s: %d tokens, finish %s\n  %s\n", stream->id().c_str(), tokens,
                                peregrine::finish_reason_name(out.finish), text.c_str());
            }
            if (tokens == 0) return 1;
        }
        std::printf("steps run: %llu\n", static_cast<unsigned long long>(engine->stats().steps));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
