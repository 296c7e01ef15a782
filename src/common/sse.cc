#include "common/sse.h"

#include <string_view>

namespace failsafe {

std::vector<std::string> TakeSseData(std::string* buffer) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    // An event ends at a blank line ("\n\n"; "\r\n\r\n" from other servers).
    size_t end = buffer->find("\n\n", start);
    size_t sep = 2;
    const size_t crlf = buffer->find("\r\n\r\n", start);
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) break;
    std::string_view event(buffer->data() + start, end - start);
    std::string data;
    bool any = false;
    while (!event.empty()) {
      size_t nl = event.find('\n');
      std::string_view line = event.substr(0, nl);
      event = nl == std::string_view::npos ? std::string_view() : event.substr(nl + 1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.substr(0, 5) != "data:") continue;
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      if (any) data += '\n';
      data.append(line);
      any = true;
    }
    if (any) out.push_back(std::move(data));
    start = end + sep;
  }
  buffer->erase(0, start);
  return out;
}

}  // namespace failsafe
