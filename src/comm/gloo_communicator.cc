#include "comm/gloo_communicator.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <set>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "comm/kv_store.h"
#include "comm/tcp_loss.h"
#include "common/clock.h"
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

// out[i] = srcs[0][i] + srcs[1][i] + ... in rank order, as the shared-memory
// group sums (floats: bit-identical results in either kind of group;
// fixed-point: AddFixed, exact in any order). `out` may be one of `srcs`:
// each element is read before it is written.
float Add(float a, float b) { return a + b; }
int64_t Add(int64_t a, int64_t b) { return AddFixed(a, b); }

template <typename T>
void SumInRankOrder(const T* const* srcs, int members, size_t count, T* out) {
  for (size_t i = 0; i < count; ++i) {
    T acc = srcs[0][i];
    for (int m = 1; m < members; ++m) acc = Add(acc, srcs[m][i]);
    out[i] = acc;
  }
}

// Slots of our collectives (gloo's own collectives are not used).
constexpr uint8_t kSlotPrefix = 0x51;

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
  AbortWaits();
  if (closed_) return;
  closed_ = true;
  try {
    context_->closeConnections();
  } catch (const std::exception&) {
  }
}

void GlooCommunicator::AbortWaits() {
  for (gloo::transport::UnboundBuffer* b : active_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

void GlooCommunicator::ShutdownConnections() {
  aborted_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  AbortWaits();
  if (closed_) return;
  // The connections stay open (gloo owns them) but every read and write on
  // them fails: gloo's event loop sees the end of the stream and fails the
  // pending operations, and the peers see it too. Not all of them: a send
  // that waits in a connection's transmit queue (its socket's buffer full,
  // as toward a peer behind a slow or lossy link), or a receive whose data
  // had begun to arrive, is not told of the connection's failure; the
  // waits on those are interrupted above (AbortWaits).
  for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
}

void GlooCommunicator::Abort() { ShutdownConnections(); }

void GlooCommunicator::Watch() {
  // (Sampled until the group fails: gloo may close a failed connection's
  // descriptor, whose number another socket may then take; the sampler
  // drops a descriptor that names another socket too.)
  std::unique_ptr<TcpLossSampler> sampler;
  if (on_lossy_peer_) sampler = std::make_unique<TcpLossSampler>(sockets_);
  for (;;) {
    const uint32_t seen = signal_.generation();
    if (stop_) return;
    if (signal_.raised()) {
      ShutdownConnections();
      return;
    }
    if (!sampler || sampler->connections() == 0 || aborted_) {
      signal_.WaitChange(seen);
      continue;
    }
    if (signal_.WaitChange(seen, kLossSampleMs * 1000000) || signal_.generation() != seen) continue;
    if (aborted_) continue;
    for (const TcpLossSampler::Lossy& l : sampler->Sample(MonotonicNanos()))
      on_lossy_peer_(l.peer, l.last_ns);
  }
}

Result<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(const GlooGroupOptions& o,
                                                                    AbortSignal abort) {
  auto comm = std::unique_ptr<GlooCommunicator>(new GlooCommunicator());
  comm->rank_ = o.rank;
  comm->size_ = o.size;
  comm->timeout_ms_ = o.timeout_ms;
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
    comm->on_lossy_peer_ = o.on_lossy_peer;
    GlooCommunicator* c = comm.get();
    comm->watcher_ = std::thread([c] { c->Watch(); });
  }
  return comm;
}

// The unbound buffers of the collective under way. While registered
// (Start), an abort interrupts their waits: a wait that the connections'
// failure does not reach inside gloo's transport (a receive whose data had
// begun to arrive, a send queued behind a full socket) ends at the abort
// too. Destroyed before the collective returns, which waits for gloo's
// device thread to let go of them, so nothing is written to the caller's
// memory or the scratch afterwards. A collective that did not complete
// closes the group's connections first: gloo's pairs still hold its
// operations, and a pair whose operation's buffer is gone neither reads
// nor writes its socket, so its device thread would spin on the socket's
// events until the group is destroyed.
class GlooCommunicator::Ops {
 public:
  explicit Ops(GlooCommunicator* comm) : comm_(comm) {}
  ~Ops() {
    if (!done_) comm_->Fail();
    {
      std::lock_guard<std::mutex> lock(comm_->mu_);
      comm_->active_.clear();
    }
    buffers_.clear();
  }
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  gloo::transport::UnboundBuffer* Buffer(void* ptr, size_t bytes) {
    buffers_.push_back(comm_->context_->createUnboundBuffer(ptr, bytes));
    return buffers_.back().get();
  }
  // False if the group is aborted already.
  bool Start() {
    std::lock_guard<std::mutex> lock(comm_->mu_);
    if (comm_->aborted_) return false;
    for (auto& b : buffers_) comm_->active_.push_back(b.get());
    return true;
  }
  // The collective completed: its operations are over.
  void Done() { done_ = true; }
  // Each false when the group was aborted meanwhile.
  bool WaitRecv(gloo::transport::UnboundBuffer* b) {
    return b->waitRecv(nullptr, comm_->context_->getTimeout());
  }
  bool WaitSend(gloo::transport::UnboundBuffer* b) {
    return b->waitSend(nullptr, comm_->context_->getTimeout());
  }

 private:
  GlooCommunicator* comm_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
  bool done_ = false;
};

// Reduce-scatter then all-gather, each member exchanging with every other
// directly (the group's connections are a full mesh): member r owns chunk r
// of the data, receives every member's copy of it, sums them in rank order
// and sends the sum to every member. Two exchanges deep whatever the group's
// size, and the same bits as the shared-memory group.
template <typename T>
Status GlooCommunicator::AllReduce(T* data, size_t count) {
  if (aborted_) return Aborted("collective group was aborted");
  if (size_ == 1 || count == 0) return Status::Ok();
  const int n = size_, r = rank_;
  constexpr size_t z = sizeof(T);
  auto begin = [&](int c) { return count * static_cast<size_t>(c) / static_cast<size_t>(n); };
  auto len = [&](int c) { return begin(c + 1) - begin(c); };
  const size_t mine = len(r);
  // Every member's copy of chunk r (member q's at q * mine).
  const size_t copies_bytes = mine * static_cast<size_t>(n) * z;
  if (scratch_bytes_ < copies_bytes) {
    scratch_bytes_ = copies_bytes;
    scratch_.reset(new char[scratch_bytes_]);
  }
  char* copies = scratch_.get();
  const uint64_t slot = gloo::Slot::build(kSlotPrefix, tag_++);
  try {
    Ops ops(this);
    auto* out = ops.Buffer(data, count * z);
    auto* in = ops.Buffer(copies, copies_bytes);
    if (!ops.Start()) return Aborted("collective group was aborted");
    int copies_due = 0, sums_due = 0, sends = 0;
    // Receives first, so that no sender waits for one to be posted. Member
    // q's sum of chunk q lands in the data itself: q sends it only once it
    // has all of this member's copy of chunk q, so the send of that copy
    // has left the data by then.
    for (int k = 1; k < n; ++k) {
      const int q = (r + k) % n;
      if (mine > 0) {
        in->recv(q, slot, static_cast<size_t>(q) * mine * z, mine * z);
        ++copies_due;
      }
      if (len(q) > 0) {
        out->recv(q, slot + 1, begin(q) * z, len(q) * z);
        ++sums_due;
      }
    }
    for (int k = 1; k < n; ++k) {
      const int q = (r + k) % n;
      if (len(q) > 0) {
        out->send(q, slot, begin(q) * z, len(q) * z);
        ++sends;
      }
    }
    for (int i = 0; i < copies_due; ++i) {
      if (!ops.WaitRecv(in)) return Aborted("collective group was aborted");
    }
    if (mine > 0) {
      std::vector<const T*> srcs(static_cast<size_t>(n));
      for (int q = 0; q < n; ++q) {
        srcs[static_cast<size_t>(q)] =
            q == r ? data + begin(r)
                   : reinterpret_cast<const T*>(copies) + static_cast<size_t>(q) * mine;
      }
      // Chunk r is in no send under way.
      SumInRankOrder(srcs.data(), n, mine, data + begin(r));
      for (int k = 1; k < n; ++k) {
        out->send((r + k) % n, slot + 1, begin(r) * z, mine * z);
        ++sends;
      }
    }
    for (int i = 0; i < sums_due; ++i) {
      if (!ops.WaitRecv(out)) return Aborted("collective group was aborted");
    }
    for (int i = 0; i < sends; ++i) {
      if (!ops.WaitSend(out)) return Aborted("collective group was aborted");
    }
    ops.Done();
  } catch (const std::exception& e) {
    Fail();
    return Aborted("all-reduce failed: {}", e.what());
  }
  return Status::Ok();
}

Status GlooCommunicator::AllReduceSum(float* data, size_t count) { return AllReduce(data, count); }

Status GlooCommunicator::AllReduceSum(int64_t* data, size_t count) {
  return AllReduce(data, count);
}

// Every member sends its block to every other directly.
Status GlooCommunicator::AllGather(const void* send, size_t bytes, void* recv) {
  if (aborted_) return Aborted("collective group was aborted");
  char* all = static_cast<char*>(recv);
  const size_t r = static_cast<size_t>(rank_);
  if (bytes > 0 && all + r * bytes != send) std::memmove(all + r * bytes, send, bytes);
  if (size_ == 1 || bytes == 0) return Status::Ok();
  const uint64_t slot = gloo::Slot::build(kSlotPrefix, tag_++);
  try {
    Ops ops(this);
    auto* buf = ops.Buffer(all, bytes * static_cast<size_t>(size_));
    if (!ops.Start()) return Aborted("collective group was aborted");
    for (int k = 1; k < size_; ++k) {
      const int q = (rank_ + k) % size_;
      buf->recv(q, slot, static_cast<size_t>(q) * bytes, bytes);
    }
    for (int k = 1; k < size_; ++k) buf->send((rank_ + k) % size_, slot, r * bytes, bytes);
    for (int k = 1; k < size_; ++k) {
      if (!ops.WaitRecv(buf)) return Aborted("collective group was aborted");
    }
    for (int k = 1; k < size_; ++k) {
      if (!ops.WaitSend(buf)) return Aborted("collective group was aborted");
    }
    ops.Done();
  } catch (const std::exception& e) {
    Fail();
    return Aborted("all-gather failed: {}", e.what());
  }
  return Status::Ok();
}

Status GlooCommunicator::Await(const std::function<Result<bool>()>& done) {
  if (aborted_) return Aborted("collective group was aborted");
  return PollUntil(
      done, timeout_ms_,
      [this] { return aborted_.load() || (signal_.valid() && signal_.raised()); },
      [this] { Fail(); });
}

// A member leaves once every other's byte has come: each had entered.
Status GlooCommunicator::Barrier() {
  const char mine = 1;
  std::vector<char> all(static_cast<size_t>(size_));
  return AllGather(&mine, 1, all.data());
}

}  // namespace failsafe
