// The HTTP front end: OpenAI-compatible endpoints, health, metrics, and the
// admin API for failure injection.
//
// Thread-safety: Start and Stop from one thread; handlers run on the HTTP
// server's thread pool and reach the engine only through EngineService.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "model/tokenizer.h"
#include "server/engine_service.h"

namespace httplib {
class Server;
}

namespace failsafe {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  std::string model_name = "failsafe";
  bool enable_admin = false;  // /admin/* endpoints
  std::string
      admin_token;  // if set, admin calls need "Authorization: Bearer TOKEN"; else loopback only
  int http_threads = 64;
};

class HttpServer {
 public:
  HttpServer(EngineService* service, const Tokenizer* tokenizer, const ServerOptions& options);
  ~HttpServer();
  // Binds and starts serving on a background thread.
  Status Start();
  int port() const { return port_; }
  void Stop();
  // Blocks until the server stops.
  void Wait();

 private:
  void Routes();
  EngineService* const service_;
  const Tokenizer* const tokenizer_;
  const ServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace failsafe
