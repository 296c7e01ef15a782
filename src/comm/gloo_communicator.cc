#include "comm/gloo_communicator.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <condition_variable>
#include <cstdlib>
#include <set>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "comm/kv_store.h"
#include "common/fixed_point.h"

namespace failsafe {

namespace {

// gloo's Store over our TCP key-value store.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  // `cancelled`: the group was aborted (its members stop waiting for peers).
  StoreAdapter(std::unique_ptr<KvStoreClient> client, int64_t timeout_ms,
               std::function<bool()> cancelled)
      : client_(std::move(client)), timeout_ms_(timeout_ms), cancelled_(std::move(cancelled)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status st = client_->Set(key, std::string(data.begin(), data.end()));
    if (!st.ok()) throw gloo::IoException(st.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = client_->Get(key, timeout_ms_, cancelled_);
    if (!v.ok()) throw gloo::IoException(v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(timeout_ms_));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (auto& k : keys) {
      auto v = client_->Get(k, timeout.count(), cancelled_);
      if (!v.ok()) throw gloo::IoException(v.status().ToString());
    }
  }

 private:
  std::unique_ptr<KvStoreClient> client_;
  int64_t timeout_ms_;
  std::function<bool()> cancelled_;
};

void SumFloats(void* c, const void* a, const void* b, size_t n) { gloo::sum<float>(c, a, b, n); }

void SumFixed(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<int64_t*>(c);
  const auto* x = static_cast<const int64_t*>(a);
  const auto* y = static_cast<const int64_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = AddFixed(x[i], y[i]);
}

// The process's open TCP sockets.
std::set<int> TcpSockets() {
  std::set<int> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return out;
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    struct stat st;
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      continue;
    if (addr.ss_family == AF_INET || addr.ss_family == AF_INET6) out.insert(static_cast<int>(fd));
  }
  ::closedir(dir);
  return out;
}

}  // namespace

GlooCommunicator::~GlooCommunicator() {
  if (watcher_.joinable()) {
    stop_ = true;
    signal_.Wake();
    watcher_.join();
  }
}

// A failed collective closes every connection of this member, so its peers'
// pending collectives fail too, and theirs close in turn: one dead device
// fails the whole group quickly instead of at the timeout.
void GlooCommunicator::Fail() {
  aborted_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  try {
    context_->closeConnections();
  } catch (const std::exception&) {
  }
}

void GlooCommunicator::ShutdownConnections() {
  aborted_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  // The connections stay open (gloo owns them) but every read and write on
  // them fails: gloo's event loop sees the end of the stream and fails the
  // pending operations, and the peers see it too. Not all of them: a send
  // that waits in a connection's transmit queue (its socket's buffer full,
  // as toward a peer behind a slow or lossy link), or a receive whose data
  // had begun to arrive, is not told of the connection's failure and waits
  // for gloo's timeout (the receive into gloo's own scratch buffer, out of
  // reach here); the coordinator declares such a member dead when it does
  // not answer the abort within its grace.
  for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
}

void GlooCommunicator::Abort() { ShutdownConnections(); }

void GlooCommunicator::Watch() {
  for (;;) {
    const uint32_t seen = signal_.generation();
    if (stop_) return;
    if (signal_.raised()) {
      ShutdownConnections();
      return;
    }
    signal_.WaitChange(seen);
  }
}

Result<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(const GlooGroupOptions& o,
                                                                    AbortSignal abort) {
  auto comm = std::unique_ptr<GlooCommunicator>(new GlooCommunicator());
  comm->rank_ = o.rank;
  comm->size_ = o.size;
  FS_ASSIGN_OR_RETURN(auto client,
                      KvStoreClient::Connect(o.store_host, o.store_port, o.timeout_ms));
  const std::set<int> before = TcpSockets();
  // The rendezvous (every member's address through the store, then a
  // connection to each) runs on a thread of its own: an aborted group (a
  // member declared dead meanwhile) ends the wait at once, not gloo's
  // timeout, and the thread is left to end by itself.
  struct Rendezvous {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::shared_ptr<gloo::Context> context;
    std::string error;
    std::atomic<bool> cancel{false};
  };
  auto rv = std::make_shared<Rendezvous>();
  auto run = [rv, o, client = std::move(client)]() mutable {
    std::shared_ptr<gloo::Context> context;
    std::string error;
    try {
      StoreAdapter store(std::move(client), o.timeout_ms, [rv] { return rv->cancel.load(); });
      gloo::rendezvous::PrefixStore prefixed(o.prefix, store);
      gloo::transport::tcp::attr attr;
      attr.hostname = o.hostname;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto c = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
      c->setTimeout(std::chrono::milliseconds(o.timeout_ms));
      c->connectFullMesh(prefixed, device);
      context = c;
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard<std::mutex> lock(rv->mu);
    rv->context = std::move(context);
    rv->error = std::move(error);
    rv->done = true;
    rv->cv.notify_all();
  };
  if (!abort.valid()) {
    run();
  } else {
    std::thread t(std::move(run));
    std::unique_lock<std::mutex> lock(rv->mu);
    while (!rv->done) {
      rv->cv.wait_for(lock, std::chrono::milliseconds(50));
      if (!rv->done && abort.raised()) {
        rv->cancel = true;
        lock.unlock();
        t.detach();
        return Aborted("gloo rendezvous: the group was aborted");
      }
    }
    lock.unlock();
    t.join();
  }
  if (!rv->context) return Unavailable("gloo rendezvous failed: {}", rv->error);
  comm->context_ = rv->context;
  if (abort.valid()) {
    // The connections gloo opened (the store client is closed by now).
    for (int fd : TcpSockets()) {
      if (!before.count(fd)) comm->sockets_.push_back(fd);
    }
    comm->signal_ = std::move(abort);
    GlooCommunicator* c = comm.get();
    comm->watcher_ = std::thread([c] { c->Watch(); });
  }
  return comm;
}

template <typename T>
Status GlooCommunicator::AllReduce(T* data, size_t count, ReduceFn reduce) {
  if (aborted_) return Aborted("collective group was aborted");
  if (size_ == 1) return Status::Ok();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(reduce);
    opts.setTag(tag_++);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    Fail();
    return Aborted("all-reduce failed: {}", e.what());
  }
  return Status::Ok();
}

Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  return AllReduce(data, count, &SumFloats);
}

Status GlooCommunicator::AllReduceSum(int64_t* data, size_t count) {
  return AllReduce(data, count, &SumFixed);
}

Status GlooCommunicator::AllGather(const void* send, size_t bytes, void* recv) {
  if (aborted_) return Aborted("collective group was aborted");
  try {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<char*>(static_cast<const char*>(send)), bytes);
    opts.setOutput(static_cast<char*>(recv), bytes * static_cast<size_t>(size_));
    opts.setTag(tag_++);
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    Fail();
    return Aborted("all-gather failed: {}", e.what());
  }
  return Status::Ok();
}

Status GlooCommunicator::Barrier() {
  if (aborted_) return Aborted("collective group was aborted");
  try {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag_++);
    gloo::barrier(opts);
  } catch (const std::exception& e) {
    Fail();
    return Aborted("barrier failed: {}", e.what());
  }
  return Status::Ok();
}

}  // namespace failsafe
