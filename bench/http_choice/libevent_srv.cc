// libevent evhttp: one event-base thread; chunks sent from a tick event activated by a producer
// thread.
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/thread.h>
#include <atomic>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include "common.h"
std::atomic<int64_t> g_last_detect{0};
int g_streams = 0;
std::set<evhttp_request*> g_live;
event* g_tick;
void OnClose(evhttp_connection* c, void* arg) {
  g_last_detect = NowNs();
  g_streams--;
  g_live.erase((evhttp_request*)arg);
}
void Handler(evhttp_request* req, void*) {
  std::string uri = evhttp_request_get_uri(req);
  evbuffer* b = evbuffer_new();
  if (uri == "/health") {
    evbuffer_add_printf(b, "{\"status\":\"ok\"}");
    evhttp_send_reply(req, 200, "OK", b);
  } else if (uri == "/stats") {
    evbuffer_add_printf(b, "%lld %d", (long long)g_last_detect.load(), g_streams);
    evhttp_send_reply(req, 200, "OK", b);
  } else if (uri == "/wait" || uri == "/stream") {
    g_streams++;
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), OnClose, req);
    if (uri == "/stream") {
      evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                        "text/event-stream");
      evhttp_send_reply_start(req, 200, "OK");
      g_live.insert(req);
    }
  } else
    evhttp_send_reply(req, 404, "NF", b);
  evbuffer_free(b);
}
void Tick(evutil_socket_t, short, void*) {
  for (evhttp_request* r : g_live) {
    evbuffer* b = evbuffer_new();
    evbuffer_add(b, kFrame, sizeof(kFrame) - 1);
    evhttp_send_reply_chunk(r, b);
    evbuffer_free(b);
  }
}
int main(int argc, char** argv) {
  evthread_use_pthreads();
  int port = atoi(argv[1]);
  int tick_ms = argc > 2 ? atoi(argv[2]) : 20;
  event_base* base = event_base_new();
  evhttp* h = evhttp_new(base);
  evhttp_bind_socket(h, "127.0.0.1", port);
  evhttp_set_gencb(h, Handler, nullptr);
  g_tick = event_new(base, -1, 0, Tick, nullptr);
  std::thread prod([&] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(tick_ms));
      event_active(g_tick, 0, 0);
    }
  });
  event_base_dispatch(base);
}
