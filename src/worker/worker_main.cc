#include "worker/worker_main.h"

#include <sys/prctl.h>

#include <csignal>
#include <memory>

#include "backend/backend.h"
#include "comm/abort_signal.h"
#include "comm/channel.h"
#include "comm/gloo_communicator.h"
#include "comm/shm_communicator.h"
#include "common/clock.h"
#include "common/log.h"
#include "placement/plan_json.h"
#include "worker/device_model.h"
#include "worker/device_progress.h"
#include "worker/protocol.h"

namespace failsafe {

namespace {

class Worker {
 public:
  explicit Worker(int fd) : channel_(fd) {}

  int Run() {
    while (true) {
      Message m;
      Status st = channel_.Receive(&m);
      if (!st.ok()) return 0;  // the coordinator is gone
      for (size_t i = 0; i < m.fds.size(); ++i) fds_.push_back(m.fds[i]);
      std::string body;
      DeviceProgressRegion::TookRequest(progress_slot_);
      FS_LOG_DEBUG("request op {} seq {}", m.type & 0xff, m.type >> 8);
      Status result = Handle(m, &body);
      FS_LOG_DEBUG("reply to seq {}: {}", m.type >> 8, result.ToString());
      CloseUnusedFds();
      // The reply echoes the request's sequence number (the type's high bits).
      const uint32_t reply = static_cast<uint32_t>(WorkerOp::kReply) | (m.type & ~0xffu);
      if (!channel_.Send(reply, EncodeReply(result, body)).ok()) return 0;
      if (static_cast<WorkerOp>(m.type & 0xff) == WorkerOp::kShutdown) return 0;
    }
  }

 private:
  Status Handle(const Message& m, std::string* body) {
    WireReader r(m.payload);
    switch (static_cast<WorkerOp>(m.type & 0xff)) {
      case WorkerOp::kInit: {
        WorkerInit init;
        if (!init.Decode(&r) || m.fds.size() < 2 || m.fds.size() > 3) {
          if (init.protocol_version != kWorkerProtocolVersion) {
            return FailedPrecondition("the coordinator speaks protocol version {}, this worker {}",
                                      init.protocol_version, kWorkerProtocolVersion);
          }
          return InvalidArgument("malformed init");
        }
        return Init(init, TakeFd(m.fds[0]), TakeFd(m.fds[1]),
                    m.fds.size() > 2 ? TakeFd(m.fds[2]) : -1);
      }
      case WorkerOp::kDrainBackup:
        if (device_) device_->DrainBackup();
        return Status::Ok();
      case WorkerOp::kApplyPlan: {
        if (!device_ || !comm_) return FailedPrecondition("no device or group");
        ApplyPlanRequest req;
        if (!req.Decode(&r)) return InvalidArgument("malformed plan change");
        FS_ASSIGN_OR_RETURN(Plan prev, PlanFromJson(req.prev_plan_json));
        FS_ASSIGN_OR_RETURN(Plan next, PlanFromJson(req.next_plan_json));
        ApplyStats stats;
        FS_RETURN_IF_ERROR(device_->ApplyPlan(prev, next, static_cast<RecoveryMode>(req.mode),
                                              *host_, *comm_, req.seqs, &stats));
        WireWriter w;
        EncodeApplyStats(stats, &w);
        *body = w.Take();
        return Status::Ok();
      }
      case WorkerOp::kLoadPlan: {
        if (!device_) return FailedPrecondition("not initialised");
        FS_ASSIGN_OR_RETURN(Plan plan, PlanFromJson(m.payload));
        const int64_t t0 = MonotonicNanos();
        FS_RETURN_IF_ERROR(device_->LoadShare(plan, *host_));
        WireWriter w;
        w.Put<int64_t>(device_->weight_bytes());
        w.Put<int64_t>(MonotonicNanos() - t0);
        *body = w.Take();
        return Status::Ok();
      }
      case WorkerOp::kJoinGroup: {
        GroupSpec spec;
        if (!spec.Decode(&r)) return InvalidArgument("malformed group");
        comm_.reset();
        if (m.fds.size() != 1) return InvalidArgument("a group without its region");
        std::unique_ptr<Communicator> comm;
        if (spec.kind == CommKind::kShm) {
          FS_ASSIGN_OR_RETURN(ShmRegion region, ShmRegion::Map(TakeFd(m.fds[0])));
          comm = std::make_unique<ShmCommunicator>(std::move(region), spec.rank, spec.timeout_ms);
        } else {
          GlooGroupOptions o;
          o.store_host = spec.store_host;
          o.store_port = spec.store_port;
          o.prefix = spec.prefix;
          o.hostname = spec.hostname;
          o.rank = spec.rank;
          o.size = spec.size;
          o.timeout_ms = spec.timeout_ms;
          FS_ASSIGN_OR_RETURN(AbortSignal abort, AbortSignal::Map(TakeFd(m.fds[0])));
          FS_ASSIGN_OR_RETURN(comm, GlooCommunicator::Connect(o, std::move(abort)));
        }
        comm_ = std::make_unique<ProgressCommunicator>(std::move(comm), progress_slot_);
        return Status::Ok();
      }
      case WorkerOp::kStep: {
        if (!device_ || !comm_) return FailedPrecondition("no plan or group");
        StepBatch batch;
        if (!DecodeBatch(&r, device_->device_id(), &batch))
          return InvalidArgument("malformed step");
        if (batch.num_logits_rows > logits_rows_) {
          return InvalidArgument("step needs {} logits rows, the region has {}",
                                 batch.num_logits_rows, logits_rows_);
        }
        ForwardStats stats;
        FS_RETURN_IF_ERROR(
            device_->Forward(batch, *comm_, static_cast<float*>(logits_.data()), &stats));
        WireWriter w;
        EncodeStats(stats, &w);
        *body = w.Take();
        return Status::Ok();
      }
      case WorkerOp::kFreeSeqs: {
        auto ids = r.GetVector<int64_t>();
        if (!r.ok() || !device_) return InvalidArgument("malformed free");
        // The backup must not copy pages that are about to be reused.
        device_->DrainBackup();
        for (int64_t id : ids) device_->FreeSeq(id);
        return Status::Ok();
      }
      case WorkerOp::kSetSpeed: {
        const double speed = r.Get<double>();
        if (!r.ok() || !(speed > 0 && speed <= 1))
          return InvalidArgument("a compute speed must be in (0, 1]");
        if (!device_) return FailedPrecondition("not initialised");
        device_->SetComputeSpeed(speed);
        return Status::Ok();
      }
      case WorkerOp::kPing:
      case WorkerOp::kShutdown:
        return Status::Ok();
      default:
        return InvalidArgument("unknown op {}", m.type);
    }
  }

  Status Init(const WorkerInit& init, int logits_fd, int progress_fd, int backup_fd) {
    SetLogTag("device " + std::to_string(init.device_id));
    FS_ASSIGN_OR_RETURN(progress_, DeviceProgressRegion::Map(progress_fd));
    progress_slot_ = progress_.slot(init.device_id);
    if (!progress_slot_) return InvalidArgument("the progress region has no slot for this device");
    FS_ASSIGN_OR_RETURN(config_, ModelConfig::Load(init.model_dir));
    FS_ASSIGN_OR_RETURN(host_, WeightStore::Open(init.model_dir, config_));
    FS_ASSIGN_OR_RETURN(logits_, ShmRegion::Map(logits_fd));
    logits_rows_ = init.logits_rows;
    if (static_cast<size_t>(logits_rows_) * config_.vocab_size * sizeof(float) > logits_.size()) {
      return InvalidArgument("logits region is too small");
    }
    backend_ = MakeCpuBackend(init.threads);
    DeviceOptions d;
    d.block_size = init.block_size;
    d.kv_pages = init.kv_pages;
    device_ = std::make_unique<DeviceModel>(config_, init.device_id, backend_.get(), d);
    if (backup_fd >= 0) {
      FS_ASSIGN_OR_RETURN(backup_, ShmRegion::Map(backup_fd));
      const auto* h = static_cast<const BackupHeader*>(backup_.data());
      BackupLayout layout(*h);
      if (h->magic != BackupLayout::kMagic || layout.total_bytes() > backup_.size() ||
          h->num_layers != config_.num_layers || h->num_kv_heads != config_.num_kv_heads ||
          h->head_dim != config_.head_dim || h->block_size != init.block_size ||
          init.device_id >= h->num_devices) {
        return InvalidArgument("the KV backup region does not match the model");
      }
      backup_writer_ =
          std::make_unique<BackupWriter>(backup_.data(), layout, init.device_id, progress_slot_);
      device_->SetBackup(backup_writer_.get(), layout, backup_.data());
    }
    return Status::Ok();
  }

  // Received descriptors are owned here until a handler takes one.
  int TakeFd(int fd) {
    std::erase(fds_, fd);
    return fd;
  }
  void CloseUnusedFds() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  }

  Channel channel_;
  std::vector<int> fds_;
  ModelConfig config_;
  std::unique_ptr<WeightStore> host_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceModel> device_;
  std::unique_ptr<Communicator> comm_;
  DeviceProgressRegion progress_;
  DeviceProgressSlot* progress_slot_ = nullptr;  // this device's, once initialised
  ShmRegion logits_;
  int64_t logits_rows_ = 0;
  ShmRegion backup_;
  std::unique_ptr<BackupWriter> backup_writer_;  // destroyed before device_ (declared after)
};

}  // namespace

int RunWorker(int control_fd) {
  // A device does not outlive its coordinator.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::signal(SIGPIPE, SIG_IGN);
  Worker w(control_fd);
  return w.Run();
}

}  // namespace failsafe
