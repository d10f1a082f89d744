// A read-only memory map of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace peregrine {

class MappedFile {
  public:
    // Throws Error naming the path when the file cannot be opened or mapped.
    explicit MappedFile(std::string path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

  private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace peregrine
