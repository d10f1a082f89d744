// Version and build facts of the Peregrine library.
#pragma once

#include <string>

namespace peregrine {

const char* version();
// Multi-line description: version, backends compiled in, CPU kernels this machine gets.
std::string build_info();

}  // namespace peregrine
