// The model's recommended sampling defaults (GenerationDefaults, include/peregrine/engine.h):
// applied the same way by `generate` and `serve`, and described for their load logs.
#include <algorithm>
#include <sstream>

#include "peregrine/engine.h"

namespace peregrine {

void apply_generation_defaults(const GenerationDefaults& d, SamplingParams& p) {
    if (d.temperature) p.temperature = *d.temperature;
    if (d.top_p) p.top_p = *d.top_p;
    if (d.top_k) p.top_k = std::max(0, *d.top_k);
    if (d.min_p) p.min_p = *d.min_p;
    if (d.repetition_penalty) p.repetition_penalty = *d.repetition_penalty;
}

std::string describe(const GenerationDefaults& d) {
    std::ostringstream os;
    auto field = [&](const char* name, const auto& v) {
        if (!v) return;
        if (os.tellp() > 0) os << ' ';
        os << name << '=' << *v;
    };
    field("temperature", d.temperature);
    field("top_p", d.top_p);
    field("top_k", d.top_k);
    field("min_p", d.min_p);
    field("repetition_penalty", d.repetition_penalty);
    return os.tellp() > 0 ? os.str() : "none";
}

}  // namespace peregrine
