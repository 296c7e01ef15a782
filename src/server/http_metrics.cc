#include "server/http_metrics.h"

#include <fmt/format.h>

namespace failsafe {

void HttpMetrics::Response(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  responses_[status]++;
}

void HttpMetrics::Render(std::string* out) const {
  auto one = [&](const char* name, const char* type, const char* help, int64_t v) {
    *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  one("failsafe_http_connections_open", "gauge", "Open HTTP connections.",
      connections_open_.load());
  one("failsafe_http_connections_refused_total", "counter",
      "Connections answered 429 at once because the server held its maximum.",
      connections_refused_.load());
  one("failsafe_http_requests_in_flight", "gauge", "HTTP requests read and not yet answered whole.",
      in_flight_.load());
  one("failsafe_http_client_disconnects_total", "counter",
      "Clients that left before their response ended (their requests are cancelled).",
      client_gone_.load());
  *out +=
      "# HELP failsafe_http_responses_total HTTP responses by status code.\n"
      "# TYPE failsafe_http_responses_total counter\n";
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [code, n] : responses_)
    *out += fmt::format("failsafe_http_responses_total{{code=\"{}\"}} {}\n", code, n);
}

}  // namespace failsafe
