// Server-sent events on an HTTP/1.1 response: the framing of one event, and of the chunked
// transfer coding that carries a stream of them (HTTP/1.0 clients get the bytes unframed, the
// body ending with the connection).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace peregrine::server {

// The headers after Content-Type that start an event stream (proxies must not buffer it).
constexpr std::string_view kEventStreamHeaders = "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";

// One event: `data: <data>\n\n`. `data` is one line (compact JSON, or [DONE]).
inline void append_sse_event(std::string& out, std::string_view data) {
    out += "data: ";
    out += data;
    out += "\n\n";
}

// One chunk of the chunked transfer coding: its size in hex, CRLF, the bytes, CRLF.
inline void append_chunk(std::string& out, std::string_view bytes) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", bytes.size());
    out += size;
    out += bytes;
    out += "\r\n";
}

// The zero-length chunk that ends a chunked body (no trailers).
constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace peregrine::server
