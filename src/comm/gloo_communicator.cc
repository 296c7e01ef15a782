#include "comm/gloo_communicator.h"

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

namespace failsafe {

namespace {

// gloo's Store over our TCP key-value store.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::unique_ptr<KvStoreClient> client, int64_t timeout_ms)
      : client_(std::move(client)), timeout_ms_(timeout_ms) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status st = client_->Set(key, std::string(data.begin(), data.end()));
    if (!st.ok()) throw gloo::IoException(st.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = client_->Get(key, timeout_ms_);
    if (!v.ok()) throw gloo::IoException(v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(timeout_ms_));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (auto& k : keys) {
      auto v = client_->Get(k, timeout.count());
      if (!v.ok()) throw gloo::IoException(v.status().ToString());
    }
  }

 private:
  std::unique_ptr<KvStoreClient> client_;
  int64_t timeout_ms_;
};

void SumFloats(void* c, const void* a, const void* b, size_t n) { gloo::sum<float>(c, a, b, n); }

}  // namespace

GlooCommunicator::~GlooCommunicator() = default;

// A failed collective closes every connection of this member, so its peers'
// pending collectives fail too, and theirs close in turn: one dead device
// fails the whole group quickly instead of at the timeout.
void GlooCommunicator::Fail() {
  aborted_ = true;
  try {
    context_->closeConnections();
  } catch (const std::exception&) {
  }
}

Result<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(const GlooGroupOptions& o) {
  auto comm = std::unique_ptr<GlooCommunicator>(new GlooCommunicator());
  comm->rank_ = o.rank;
  comm->size_ = o.size;
  FS_ASSIGN_OR_RETURN(auto client,
                      KvStoreClient::Connect(o.store_host, o.store_port, o.timeout_ms));
  try {
    StoreAdapter store(std::move(client), o.timeout_ms);
    gloo::rendezvous::PrefixStore prefixed(o.prefix, store);
    gloo::transport::tcp::attr attr;
    attr.hostname = o.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    context->setTimeout(std::chrono::milliseconds(o.timeout_ms));
    context->connectFullMesh(prefixed, device);
    comm->context_ = context;
  } catch (const std::exception& e) {
    return Unavailable("gloo rendezvous failed: {}", e.what());
  }
  return comm;
}

Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  if (aborted_) return Aborted("collective group was aborted");
  if (size_ == 1) return Status::Ok();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(&SumFloats);
    opts.setTag(tag_++);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    Fail();
    return Aborted("all-reduce failed: {}", e.what());
  }
  return Status::Ok();
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
