// The chat page of `serve` (src/server/ui/chat.html, compiled in by CMake from ui_page.cc.in).
#pragma once

#include <string_view>

namespace peregrine::server {

std::string_view chat_page();  // the whole HTML document, UTF-8

}  // namespace peregrine::server
