// Safetensors files (single or sharded through model.safetensors.index.json), memory-mapped.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace peregrine {

struct SafetensorsEntry {
    Tensor view;             // points into the mapping
    const MappedFile* file;  // which shard holds it
};

class SafetensorsSet {
  public:
    // `dir` holds model.safetensors or model.safetensors.index.json (+ shards).
    static SafetensorsSet open_dir(const std::string& dir);
    // One file.
    static SafetensorsSet open_file(const std::string& path);

    const SafetensorsEntry* find(const std::string& name) const;
    const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }

  private:
    void add_file(const std::string& path);

    std::vector<std::unique_ptr<MappedFile>> files_;
    std::map<std::string, SafetensorsEntry> entries_;
};

}  // namespace peregrine
