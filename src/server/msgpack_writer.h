// A MessagePack encoder for the few types the KV-event wire format uses (nil, non-negative and
// negative integers, float64, strings, arrays), big-endian as the spec says. Writing only: the
// readers are the subscribers' (vLLM's msgspec, llm-d's Go decoder, Python's msgpack).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace peregrine::server {

class MsgpackWriter {
  public:
    const std::string& bytes() const { return out_; }

    void nil() { out_.push_back(static_cast<char>(0xc0)); }
    void uint(uint64_t v) {
        if (v < 0x80) {
            out_.push_back(static_cast<char>(v));
        } else if (v <= 0xff) {
            tag(0xcc, v, 1);
        } else if (v <= 0xffff) {
            tag(0xcd, v, 2);
        } else if (v <= 0xffffffffu) {
            tag(0xce, v, 4);
        } else {
            tag(0xcf, v, 8);
        }
    }
    void sint(int64_t v) {
        if (v >= 0) return uint(static_cast<uint64_t>(v));
        if (v >= -32) {
            out_.push_back(static_cast<char>(v));  // negative fixint 0xe0..0xff
        } else if (v >= INT32_MIN) {
            tag(0xd2, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
        } else {
            tag(0xd3, static_cast<uint64_t>(v), 8);
        }
    }
    void float64(double v) {
        uint64_t bits;
        std::memcpy(&bits, &v, 8);
        tag(0xcb, bits, 8);
    }
    void str(std::string_view s) {
        const size_t n = s.size();
        if (n < 32)
            out_.push_back(static_cast<char>(0xa0 | n));
        else if (n <= 0xff)
            tag(0xd9, n, 1);
        else if (n <= 0xffff)
            tag(0xda, n, 2);
        else
            tag(0xdb, n, 4);
        out_.append(s);
    }
    // An array header; the caller writes `n` elements next.
    void array(size_t n) {
        if (n < 16)
            out_.push_back(static_cast<char>(0x90 | n));
        else if (n <= 0xffff)
            tag(0xdc, n, 2);
        else
            tag(0xdd, n, 4);
    }

  private:
    void tag(unsigned char t, uint64_t v, int bytes) {
        out_.push_back(static_cast<char>(t));
        for (int i = bytes - 1; i >= 0; --i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    }
    std::string out_;
};

}  // namespace peregrine::server
