// libmicrohttpd 0.9.75: internal epoll thread pool of 2; streams are suspended connections resumed
// per tick (the documented way to wait for data); completion callback reports client aborts.
#include <microhttpd.h>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include "common.h"
std::atomic<int64_t> g_last_detect{0};
std::atomic<int> g_streams{0};
struct Stream {
  MHD_Connection* c;
  std::atomic<int> pending{0};
  bool wait = false;
};
std::mutex g_mu;
std::set<Stream*> g_live;
ssize_t Reader(void* cls, uint64_t, char* buf, size_t max) {
  Stream* s = (Stream*)cls;
  if (s->wait) {
    std::lock_guard<std::mutex> l(g_mu);
    MHD_suspend_connection(s->c);
    return 0;
  }
  int n = s->pending.exchange(0);
  size_t k = 0;
  for (int i = 0; i < n && k + sizeof(kFrame) - 1 <= max; ++i) {
    memcpy(buf + k, kFrame, sizeof(kFrame) - 1);
    k += sizeof(kFrame) - 1;
  }
  if (k == 0) {
    std::lock_guard<std::mutex> l(g_mu);
    MHD_suspend_connection(s->c);
  }
  return k;
}
void Free(void* cls) {
  Stream* s = (Stream*)cls;
  std::lock_guard<std::mutex> l(g_mu);
  g_live.erase(s);
  delete s;
}
void Completed(void*, MHD_Connection*, void** ctx, MHD_RequestTerminationCode code) {
  if (code == MHD_REQUEST_TERMINATED_CLIENT_ABORT || code == MHD_REQUEST_TERMINATED_READ_ERROR ||
      code == MHD_REQUEST_TERMINATED_WITH_ERROR) {
    g_last_detect = NowNs();
  }
}
MHD_Result Handler(void*, MHD_Connection* c, const char* url, const char*, const char*, const char*,
                   size_t*, void** ctx) {
  if (!*ctx) {
    *ctx = (void*)1;
    return MHD_YES;
  }
  std::string u = url;
  if (u == "/health" || u == "/stats") {
    std::string body = u == "/health" ? "{\"status\":\"ok\"}"
                                      : std::to_string(g_last_detect.load()) + " " +
                                            std::to_string(g_streams.load());
    MHD_Response* r =
        MHD_create_response_from_buffer(body.size(), (void*)body.data(), MHD_RESPMEM_MUST_COPY);
    MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
  }
  Stream* s = new Stream;
  s->c = c;
  s->wait = u == "/wait";
  g_streams++;
  MHD_Response* r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, Reader, s, Free);
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  {
    std::lock_guard<std::mutex> l(g_mu);
    g_live.insert(s);
  }
  MHD_Result ok = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ok;
}
int main(int argc, char** argv) {
  int port = atoi(argv[1]);
  int tick_ms = argc > 2 ? atoi(argv[2]) : 20;
  MHD_Daemon* d =
      MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME,
                       port, nullptr, nullptr, Handler, nullptr, MHD_OPTION_THREAD_POOL_SIZE, 2,
                       MHD_OPTION_CONNECTION_LIMIT, 4000, MHD_OPTION_NOTIFY_COMPLETED, Completed,
                       nullptr, MHD_OPTION_CONNECTION_TIMEOUT, 0, MHD_OPTION_END);
  if (!d) return 1;
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(tick_ms));
    std::lock_guard<std::mutex> l(g_mu);
    for (Stream* s : g_live)
      if (!s->wait) {
        s->pending++;
        MHD_resume_connection(s->c);
      }
  }
}
