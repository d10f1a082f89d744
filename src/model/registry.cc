#include "model/registry.h"

#include <algorithm>

#include "core/error.h"

// Every architecture, in the order detection tries them (and error messages list them), one
// line each: ARCH(qwen2) registers `arch::qwen2`, defined in src/model/arch/qwen2.cc.
#define PG_ARCHITECTURES(ARCH) \
    ARCH(llama)                \
    ARCH(mistral)              \
    ARCH(qwen2)                \
    ARCH(qwen3)

namespace peregrine {

namespace arch {
#define PG_DECLARE_ARCH(name) extern const Architecture name;
PG_ARCHITECTURES(PG_DECLARE_ARCH)
#undef PG_DECLARE_ARCH
}  // namespace arch

namespace {

#define PG_ARCH_ADDRESS(name) &arch::name,
const Architecture* const kArchitectures[] = {PG_ARCHITECTURES(PG_ARCH_ADDRESS)};
#undef PG_ARCH_ADDRESS

bool names(const std::array<const char*, 4>& list, const std::string& name) {
    return std::any_of(list.begin(), list.end(), [&](const char* n) { return n && name == n; });
}

std::string supported_list() {
    std::string s;
    for (const Architecture* a : kArchitectures) s += str_cat(s.empty() ? "" : ", ", a->name);
    return s;
}

}  // namespace

const Architecture& detect_architecture(ModelFormat format, const std::string& name, const std::string& file) {
    const bool hf = format == ModelFormat::HuggingFace;
    for (const Architecture* a : kArchitectures)
        if (names(hf ? a->hf_names : a->gguf_names, name)) return *a;
    fail(file, ": ", hf ? "model_type" : "general.architecture", " '", name, "' is not supported (", supported_list(),
         ")");
}

const Architecture& architecture_named(const std::string& name) {
    for (const Architecture* a : kArchitectures)
        if (name == a->name) return *a;
    fail("architecture '", name, "' is not registered (", supported_list(), ")");
}

std::unique_ptr<Model> create_model(const LoadedModel& loaded, Backend& backend, const ModelParallel& par) {
    return architecture_named(loaded.config.arch).build(loaded, backend, par);
}

}  // namespace peregrine
