// Exchange::send_framed_events' default: framed events (as a proxy passes a replica's stream on)
// become one send_event each, data lines joined, for exchanges that frame events themselves.
#include "server/http/exchange.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace peregrine::server {
namespace {

class RecordingExchange final : public Exchange {
  public:
    std::vector<std::string> events;
    void post(std::function<void()> fn) override { fn(); }
    void respond(int, std::string, std::string, const HeaderList&) override {}
    void start_events(const HeaderList&) override {}
    void send_event(std::string_view data) override { events.emplace_back(data); }
    void end_events() override {}
    void on_client_gone(std::function<void()>) override {}
    bool client_gone() const override { return false; }
    void accept_websocket(WebSocketSetup) override {}
};

TEST(Exchange, FramedEventsSplitIntoSendEvent) {
    RecordingExchange x;
    x.send_framed_events("data: {\"a\":1}\n\ndata:{\"b\":2}\n\nid: 7\ndata: one\ndata: two\n\ndata: [DONE]\n\n");
    EXPECT_EQ(x.events, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "one\ntwo", "[DONE]"}));
    EXPECT_FALSE(x.executor());  // no strand of its own
}

}  // namespace
}  // namespace peregrine::server
