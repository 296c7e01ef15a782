#include "server/http_server.h"

#include <pthread.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "common/fd_limit.h"
#include "common/log.h"
#include "server/api_routes.h"
#include "server/http_connection.h"

namespace failsafe {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// Descriptors kept for everything but connections: device channels, pidfds,
// shared memory, the model files, logs.
constexpr int64_t kReservedFds = 256;
// Connections beyond the maximum are still accepted to be answered 429, up to
// this many at once; past it (the open-file limit is near) they are closed.
constexpr int kRefusingConnections = 256;
constexpr int kAcceptRetryMs = 50;  // after the process ran out of descriptors
constexpr int kStopGraceMs = 1000;  // for the last answers to go out at a stop

// Names the threads of a pool (for top -H and debuggers): one task on each,
// each holding its thread until all are named.
void NamePoolThreads(asio::thread_pool& pool, int threads, const char* name) {
  struct Barrier {
    std::mutex mu;
    std::condition_variable cv;
    int named = 0;
  };
  auto b = std::make_shared<Barrier>();
  for (int i = 0; i < threads; ++i) {
    asio::post(pool, [b, threads, name] {
      ::pthread_setname_np(::pthread_self(), name);
      std::unique_lock<std::mutex> lock(b->mu);
      ++b->named;
      b->cv.notify_all();
      b->cv.wait(lock, [&] { return b->named == threads; });
    });
  }
  std::unique_lock<std::mutex> lock(b->mu);
  b->cv.wait(lock, [&] { return b->named == threads; });
}

}  // namespace

struct HttpServer::Impl {
  Impl(EngineService* s, const Tokenizer* t, const ServerOptions& o)
      : service(s),
        tokenizer(t),
        shared(std::make_shared<ServerShared>(std::max(1, o.io_threads))),
        acceptor(asio::make_strand(shared->io)),
        accept_retry(acceptor.get_executor()),
        work(std::max(1, o.work_threads)),
        admin(1) {
    shared->options = o;
    shared->work = &work;
    NamePoolThreads(work, std::max(1, o.work_threads), "http-work");
    NamePoolThreads(admin, 1, "http-admin");
  }

  void Accept();
  void OnAccept(boost::system::error_code ec, tcp::socket socket);
  // Stops accepting (on the acceptor's strand, without waiting for it).
  void CloseAcceptor();
  void Stop();

  EngineService* const service;
  const Tokenizer* const tokenizer;
  const std::shared_ptr<ServerShared> shared;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  asio::thread_pool work;
  asio::thread_pool admin;  // blocking admin calls, one at a time
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::vector<std::thread> threads;
  uint64_t next_id = 1;         // acceptor strand only
  int loops_running = 0;        // guarded by shared->mu
  bool stop_requested = false;  // guarded by shared->mu
  std::mutex stop_mu;           // one Stop at a time
  int port = 0;
  int max_connections = 0;
  bool started = false, stopped = false;
};

HttpServer::HttpServer(EngineService* service, const Tokenizer* tokenizer,
                       const ServerOptions& options)
    : impl_(std::make_unique<Impl>(service, tokenizer, options)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::AddRoute(Route route) {
  if (!impl_->started) impl_->shared->router.Add(std::move(route));
}
int HttpServer::max_connections() const { return impl_->max_connections; }

asio::io_context& HttpServer::io_context() { return impl_->shared->io; }

int64_t HttpServer::body_bytes_in_flight() const {
  const ServerShared& s = *impl_->shared;
  return s.options.max_body_bytes_in_flight - s.body_budget.load();
}

Status HttpServer::Start() {
  Impl& m = *impl_;
  ServerOptions& o = m.shared->options;
  if (m.started) return FailedPrecondition("the server was started already");
  // Connections need descriptors: raise the limit, and fit the maximum in it.
  const FileLimit limit = RaiseOpenFileLimit(static_cast<int64_t>(o.max_connections) +
                                             kReservedFds + kRefusingConnections);
  const int64_t room = limit.soft - kReservedFds - kRefusingConnections;
  m.max_connections = static_cast<int>(std::clamp<int64_t>(room, 1, o.max_connections));
  if (m.max_connections < o.max_connections) {
    FS_LOG_WARN(
        "the open-file limit ({} descriptors, hard limit {}) holds only {} connections, not the {} "
        "configured: more clients get 429; raise it (ulimit -n) to serve them",
        limit.soft, limit.hard, m.max_connections, o.max_connections);
  }
  o.max_connections = m.max_connections;
  m.shared->body_budget = o.max_body_bytes_in_flight;

  ApiContext ctx;
  ctx.service = m.service;
  ctx.tokenizer = m.tokenizer;
  ctx.options = &m.shared->options;
  ctx.http_metrics = &m.shared->metrics;
  if (m.tokenizer) ctx.grammars = std::make_shared<GrammarCache>(m.tokenizer);
  ctx.run_admin = [this](std::function<void()> fn) { asio::post(impl_->admin, std::move(fn)); };
  // Without an engine (the fleet router) only the embedding program's routes.
  if (m.service) {
    AddApiRoutes(ctx, &m.shared->router);
    AddCompletionRoutes(ctx, &m.shared->router);
  }

  // An address, or a name to resolve ("localhost").
  boost::system::error_code ec;
  tcp::resolver resolver(m.shared->io);
  auto found = resolver.resolve(o.host, std::to_string(o.port),
                                tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty())
    return InvalidArgument("--host {}: not an address this machine has ({})", o.host, ec.message());
  const tcp::endpoint ep = found.begin()->endpoint();
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (ec) return Unavailable("cannot bind to {}:{}: {}", o.host, o.port, ec.message());
  m.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  m.port = m.acceptor.local_endpoint().port();
  m.started = true;
  m.guard.emplace(m.shared->io.get_executor());
  asio::dispatch(m.acceptor.get_executor(), [this] { impl_->Accept(); });
  m.loops_running = std::max(1, o.io_threads);
  for (int i = 0; i < std::max(1, o.io_threads); ++i) {
    m.threads.emplace_back([&m] {
      ::pthread_setname_np(::pthread_self(), "http-io");
      // A handler that throws is a bug; it must not take the event loop with it.
      while (true) {
        try {
          m.shared->io.run();
          break;
        } catch (const std::exception& e) {
          FS_LOG_ERROR("HTTP event loop: unexpected exception: {}", e.what());
        }
      }
      std::lock_guard<std::mutex> lock(m.shared->mu);
      --m.loops_running;
      m.shared->changed.notify_all();
    });
  }
  return Status::Ok();
}

void HttpServer::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(shared->io),
                        [this](boost::system::error_code ec, tcp::socket socket) {
                          OnAccept(ec, std::move(socket));
                        });
}

void HttpServer::Impl::OnAccept(boost::system::error_code ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {
    // Out of descriptors or memory: the pending connection stays in the
    // backlog; try again shortly rather than spin.
    FS_LOG_WARN("accept: {}; retrying in {} ms", ec.message(), kAcceptRetryMs);
    accept_retry.expires_after(std::chrono::milliseconds(kAcceptRetryMs));
    accept_retry.async_wait([this](boost::system::error_code e) {
      if (!e) Accept();
    });
    return;
  }
  // Connections being answered 429 do not count against the maximum, so a
  // slot freed by a client that leaves goes to the next client even while
  // refused ones are still closing.
  const int64_t refusing = shared->metrics.connections_refusing();
  const bool refuse = shared->metrics.connections_open() - refusing >= max_connections;
  if (refuse) shared->metrics.ConnectionRefused();
  if (refuse && refusing >= kRefusingConnections) {
    boost::system::error_code ignored;
    socket.close(ignored);  // no descriptor to spare for an answer
  } else {
    auto conn = std::make_shared<HttpConnection>(std::move(socket), shared, next_id, refuse);
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->connections[next_id] = conn;
    }
    ++next_id;
    shared->metrics.ConnectionOpened(refuse);
    conn->Start();
  }
  Accept();
}

void HttpServer::Impl::CloseAcceptor() {
  asio::post(acceptor.get_executor(), [this] {
    boost::system::error_code ignored;
    acceptor.close(ignored);
    accept_retry.cancel();
  });
}

int HttpServer::Drain(int64_t timeout_ms) {
  Impl& m = *impl_;
  if (!m.started) return 0;
  m.shared->draining = true;
  m.CloseAcceptor();
  std::vector<std::shared_ptr<HttpConnection>> conns;
  {
    std::lock_guard<std::mutex> lock(m.shared->mu);
    for (auto& [id, weak] : m.shared->connections) {
      if (auto c = weak.lock()) conns.push_back(std::move(c));
    }
  }
  for (auto& c : conns) c->Drain();
  conns.clear();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int left = 0;
  {
    std::unique_lock<std::mutex> lock(m.shared->mu);
    m.shared->changed.wait_until(
        lock, deadline, [&] { return m.shared->metrics.in_flight() == 0 || m.stop_requested; });
    left = static_cast<int>(m.shared->metrics.in_flight());
  }
  if (left > 0)
    FS_LOG_WARN("drain: {} requests still in flight after {} ms; cutting them short", left,
                timeout_ms);
  Stop();
  return left;
}

void HttpServer::Stop() { impl_->Stop(); }

void HttpServer::Impl::Stop() {
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    stop_requested = true;
    shared->changed.notify_all();  // a drain stops waiting
  }
  std::lock_guard<std::mutex> once(stop_mu);
  if (!started || stopped) return;
  stopped = true;
  shared->draining = true;
  CloseAcceptor();
  // Abort what is in flight (the handlers cancel their engine requests), then
  // give the last answers a moment to go out.
  std::vector<std::shared_ptr<HttpConnection>> conns;
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    for (auto& [id, weak] : shared->connections) {
      if (auto c = weak.lock()) conns.push_back(std::move(c));
    }
  }
  for (auto& c : conns) c->Stop();
  conns.clear();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->changed.wait_for(lock, std::chrono::milliseconds(kStopGraceMs),
                           [&] { return shared->connections.empty(); });
  // Whoever is still writing (a client that reads slowly) is cut off.
  for (auto& [id, weak] : shared->connections) {
    if (auto c = weak.lock()) conns.push_back(std::move(c));
  }
  lock.unlock();
  for (auto& c : conns) c->ForceClose();
  conns.clear();
  // Work in hand finishes (its answers go nowhere); then the event loops run
  // out of work and return, every handler having run (no connection is left
  // holding the loop that holds it).
  shared->work = nullptr;
  work.join();
  admin.join();
  guard.reset();
  lock.lock();
  if (!shared->changed.wait_for(lock, std::chrono::milliseconds(kStopGraceMs),
                                [&] { return loops_running == 0; })) {
    shared->io.stop();
  }
  lock.unlock();
  for (auto& t : threads) t.join();
  threads.clear();
}
}  // namespace failsafe
