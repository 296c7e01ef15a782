// Routes: (method, path pattern) -> handler. A pattern is a path whose
// segments may be "{name}" (any one non-empty segment, handed to the handler
// in HttpRequest::path_params).
//
// Thread-safety: Add before the server starts; Find from any thread after.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/http_exchange.h"

namespace failsafe {

struct Route {
  std::string method;
  std::string pattern;
  HttpHandler handler;
  bool json_body = false;  // the body must be JSON (415 for another content type)
};

class Router {
 public:
  void Add(Route route);

  struct Match {
    const Route* route = nullptr;     // null: no route for this method and path
    std::vector<std::string> params;  // the pattern's {params}
    std::string allow;                // path known, method not: the methods it has ("GET, POST")
  };
  Match Find(std::string_view method, std::string_view path) const;

 private:
  std::vector<Route> routes_;
};

}  // namespace failsafe
