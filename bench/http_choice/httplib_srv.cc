// cpp-httplib 0.11: thread per connection from a fixed pool (argv[3] threads).
#include <httplib.h>
#include <atomic>
#include <condition_variable>
#include "common.h"
std::atomic<int64_t> g_last_detect{0};
std::atomic<int> g_streams{0};
std::mutex mu;
std::condition_variable cv;
uint64_t tick = 0;
int main(int argc, char** argv) {
  int port = atoi(argv[1]);
  int tick_ms = argc > 2 ? atoi(argv[2]) : 20;
  int threads = argc > 3 ? atoi(argv[3]) : 64;
  httplib::Server s;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.Get("/health", [](const httplib::Request&, httplib::Response& r) {
    r.set_content("{\"status\":\"ok\"}", "application/json");
  });
  s.Get("/stats", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(std::to_string(g_last_detect.load()) + " " + std::to_string(g_streams.load()),
                  "text/plain");
  });
  auto stream = [](bool wait) {
    return [wait](const httplib::Request&, httplib::Response& r) {
      g_streams++;
      r.set_chunked_content_provider("text/event-stream", [wait](size_t, httplib::DataSink& sink) {
        uint64_t seen;
        {
          std::lock_guard<std::mutex> l(mu);
          seen = tick;
        }
        while (true) {
          std::unique_lock<std::mutex> l(mu);
          cv.wait_for(l, std::chrono::seconds(1), [&] { return tick != seen; });
          seen = tick;
          l.unlock();
          // /wait writes nothing but a keep-alive probe once per second (how the server checks
          // today).
          bool ok = wait ? sink.is_writable() && sink.write(": k\n\n", 5)
                         : sink.write(kFrame, sizeof(kFrame) - 1);
          if (!ok) {
            g_last_detect = NowNs();
            g_streams--;
            return false;
          }
          if (wait) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
      });
    };
  };
  s.Post("/stream", stream(false));
  s.Post("/wait", stream(true));
  std::thread ticker([&] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(tick_ms));
      {
        std::lock_guard<std::mutex> l(mu);
        ++tick;
      }
      cv.notify_all();
    }
  });
  s.listen("127.0.0.1", port);
}
