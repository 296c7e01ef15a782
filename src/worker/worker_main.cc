#include "worker/worker_main.h"

#include <sys/prctl.h>

#include <csignal>
#include <functional>
#include <memory>
#include <string>

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
#include "worker/remote_link.h"

namespace failsafe {

namespace {

class Worker {
 public:
  explicit Worker(int fd) : channel_(fd) {}
  // A device on another host: requests come over `link`; `model_dir`
  // (optional) replaces the coordinator's path to the model.
  Worker(RemoteWorkerLink* link, std::string model_dir, std::string advertise)
      : link_(link), model_dir_(std::move(model_dir)), advertise_(std::move(advertise)) {}
  ~Worker() {
    // The group's watcher writes into the progress slot, and the link's
    // heartbeat reads it: both let go before the region is unmapped.
    comm_.reset();
    if (link_) link_->SetProgressSlot(nullptr);
    // The backend lets go of the shared regions it page-locked while they
    // are still mapped (they are declared after it).
    backup_writer_.reset();
    device_.reset();
    backend_.reset();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int Run() {
    while (true) {
      Message m;
      Status st = link_ ? link_->Receive(&m) : channel_.Receive(&m);
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
      const std::string payload = EncodeReply(result, body);
      if (!(link_ ? link_->SendReply(reply, payload) : channel_.Send(reply, payload)).ok())
        return 0;
      if (static_cast<WorkerOp>(m.type & 0xff) == WorkerOp::kShutdown) return 0;
    }
  }

 private:
  Status Handle(const Message& m, std::string* body) {
    WireReader r(m.payload);
    switch (static_cast<WorkerOp>(m.type & 0xff)) {
      case WorkerOp::kInit: {
        WorkerInit init;
        if (link_) {
          // No shared memory crosses hosts: the coordinator's link says
          // whether it keeps a KV backup, and its layout.
          BackupHeader backup{};
          const bool decoded = init.Decode(&r);
          if (!decoded && init.protocol_version != kWorkerProtocolVersion) {
            return FailedPrecondition("the coordinator speaks protocol version {}, this worker {}",
                                      init.protocol_version, kWorkerProtocolVersion);
          }
          if (!decoded) return InvalidArgument("malformed init");
          const bool has_backup = r.Get<uint8_t>() != 0;
          if (has_backup) backup = r.Get<BackupHeader>();
          if (!r.ok()) return InvalidArgument("malformed init");
          if (!model_dir_.empty()) init.model_dir = model_dir_;
          return InitRemote(init, has_backup ? &backup : nullptr);
        }
        if (!init.Decode(&r) || m.fds.size() < 2 || m.fds.size() > 3) {
          if (init.protocol_version != kWorkerProtocolVersion) {
            return FailedPrecondition("the coordinator speaks protocol version {}, this worker {}",
                                      init.protocol_version, kWorkerProtocolVersion);
          }
          return InvalidArgument("malformed init");
        }
        FS_ASSIGN_OR_RETURN(ShmRegion logits, ShmRegion::Map(TakeFd(m.fds[0])));
        FS_ASSIGN_OR_RETURN(DeviceProgressRegion progress,
                            DeviceProgressRegion::Map(TakeFd(m.fds[1])));
        ShmRegion backup;
        if (m.fds.size() > 2) {
          FS_ASSIGN_OR_RETURN(backup, ShmRegion::Map(TakeFd(m.fds[2])));
        }
        return Init(init, std::move(logits), std::move(progress), std::move(backup));
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
        if (link_) {
          FS_RETURN_IF_ERROR(JoinRemoteGroup(spec));
          return PrepareCollectives();
        }
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
          o.on_lossy_peer = LossReporter(o.hostname);
          FS_ASSIGN_OR_RETURN(AbortSignal abort, AbortSignal::Map(TakeFd(m.fds[0])));
          FS_ASSIGN_OR_RETURN(comm, GlooCommunicator::Connect(o, std::move(abort)));
        }
        comm_ = std::make_unique<ProgressCommunicator>(std::move(comm), progress_slot_);
        return PrepareCollectives();
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
        if (link_) FS_RETURN_IF_ERROR(SendLogits(m.type >> 8, batch.num_logits_rows));
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

  Status Init(const WorkerInit& init, ShmRegion logits, DeviceProgressRegion progress,
              ShmRegion backup) {
    SetLogTag("device " + std::to_string(init.device_id));
    progress_ = std::move(progress);
    progress_slot_ = progress_.slot(init.device_id);
    if (!progress_slot_) return InvalidArgument("the progress region has no slot for this device");
    FS_ASSIGN_OR_RETURN(config_, ModelConfig::Load(init.model_dir));
    FS_ASSIGN_OR_RETURN(host_, WeightStore::Open(init.model_dir, config_));
    logits_ = std::move(logits);
    logits_rows_ = init.logits_rows;
    if (static_cast<size_t>(logits_rows_) * config_.vocab_size * sizeof(float) > logits_.size()) {
      return InvalidArgument("logits region is too small");
    }
    if (init.gpu >= 0) {
      CudaBackendOptions o;
      o.gpu = init.gpu;
      o.gemm = static_cast<GpuGemm>(init.gpu_gemm);
      o.graphs = init.gpu_graphs != 0;
      o.dependent_launch = init.gpu_dependent_launch != 0;
      o.attention = static_cast<GpuAttention>(init.gpu_attention);
      // Choosing a product's algorithms inside a step may keep the device
      // from its next collective for longer than a hang's deadline: each
      // of its waits is a sign of life (a GPU that hangs never returns).
      o.busy = [slot = progress_slot_] { DeviceProgressRegion::Moved(slot); };
      FS_ASSIGN_OR_RETURN(backend_, MakeCudaBackend(o));
    } else {
      backend_ = MakeCpuBackend(init.threads);
    }
    backend_->PinHostMemory(logits_.data(), logits_.size());  // each step's logits land there
    DeviceOptions d;
    d.block_size = init.block_size;
    d.kv_pages = init.kv_pages;
    d.kv_dtype = static_cast<DType>(init.kv_dtype);
    d.peer_collectives = init.peer_collectives != 0;
    device_ = std::make_unique<DeviceModel>(config_, init.device_id, backend_.get(), d);
    if (backup.valid()) {
      backup_ = std::move(backup);
      const auto* h = static_cast<const BackupHeader*>(backup_.data());
      BackupLayout layout(*h);
      if (h->magic != BackupLayout::kMagic || layout.total_bytes() > backup_.size() ||
          h->num_layers != config_.num_layers || h->num_kv_heads != config_.num_kv_heads ||
          h->head_dim != config_.head_dim || h->block_size != init.block_size ||
          h->kv_dtype != init.kv_dtype || init.device_id >= h->num_devices) {
        return InvalidArgument("the KV backup region does not match the model");
      }
      // Pages go to the host and back through it: page-locked where the
      // backend gains by it (a GPU's copies).
      backend_->PinHostMemory(backup_.data(), backup_.size());
      backup_writer_ = std::make_unique<BackupWriter>(backup_.data(), layout, init.device_id,
                                                      progress_slot_, backend_.get());
      if (link_) {
        backup_writer_->SetUploader(
            [this, layout](const BackupJob& job) { UploadBackup(layout, job); });
      }
      device_->SetBackup(backup_writer_.get(), layout, backup_.data());
    }
    return Status::Ok();
  }

  // A device on another host keeps in its own memory what a local device
  // maps from the coordinator: the logits rows, its progress slot, a mirror
  // of the KV backup (written here, uploaded over the link).
  Status InitRemote(const WorkerInit& init, const BackupHeader* backup_header) {
    if (init.device_id < 0 || init.device_id >= 4096) return InvalidArgument("bad device id");
    FS_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(init.model_dir));
    FS_ASSIGN_OR_RETURN(
        ShmRegion logits,
        ShmRegion::Create("failsafe-logits",
                          static_cast<size_t>(std::max<int64_t>(init.logits_rows, 1)) *
                              config.vocab_size * sizeof(float)));
    FS_ASSIGN_OR_RETURN(DeviceProgressRegion progress,
                        DeviceProgressRegion::Create(init.device_id + 1));
    ShmRegion backup;
    if (backup_header) {
      const BackupLayout layout(*backup_header);
      FS_ASSIGN_OR_RETURN(backup, ShmRegion::Create("failsafe-kv-backup", layout.total_bytes()));
      std::memcpy(backup.data(), backup_header, sizeof(BackupHeader));
    }
    FS_RETURN_IF_ERROR(Init(init, std::move(logits), std::move(progress), std::move(backup)));
    link_->SetProgressSlot(progress_slot_);
    if (backup_.valid()) link_->SetBackupMirror(backup_.data(), backup_.size());
    return Status::Ok();
  }

  // What the device's collectives set up once per group, as every member
  // joins it (under the group's timeout, not a step's).
  Status PrepareCollectives() {
    if (!device_) return Status::Ok();
    Status st = device_->PrepareCollectives(*comm_);
    if (!st.ok()) comm_.reset();
    return st;
  }

  // Collectives across hosts are gloo's; the coordinator's aborts arrive
  // over the link and raise a signal of this process's own.
  Status JoinRemoteGroup(GroupSpec spec) {
    if (spec.kind != CommKind::kGloo) {
      return FailedPrecondition("a device on another host needs gloo collectives (--comm gloo)");
    }
    GlooGroupOptions o;
    o.store_host = spec.store_host;
    o.store_port = spec.store_port;
    o.prefix = spec.prefix;
    o.hostname = advertise_.empty() ? link_->local_address() : advertise_;
    o.rank = spec.rank;
    o.size = spec.size;
    o.timeout_ms = spec.timeout_ms;
    o.on_lossy_peer = LossReporter(o.hostname);
    FS_ASSIGN_OR_RETURN(AbortSignal abort, AbortSignal::Create());
    link_->RegisterGroup(spec.prefix, abort);
    FS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                        GlooCommunicator::Connect(o, std::move(abort)));
    comm_ = std::make_unique<ProgressCommunicator>(std::move(comm), progress_slot_);
    return Status::Ok();
  }

  // Notes in this device's progress slot the host id its peers know it by
  // (`address`, what it gives them), and returns what notes there each peer
  // host its collective connections lose frames to: the coordinator's hang
  // watch tells a lossy link's side from the healthy one by them
  // (engine/hang_detector.h LossyHost).
  std::function<void(const std::string&, int64_t)> LossReporter(const std::string& address) {
    DeviceProgressSlot* slot = progress_slot_;
    if (slot) slot->alias.store(HostId(address), std::memory_order_release);
    return [slot](const std::string& peer, int64_t when_ns) {
      DeviceProgressRegion::NoteLoss(slot, HostId(peer), when_ns);
    };
  }

  // The logits columns of this device's vocabulary chunks, to the coordinator
  // (before the step's reply, so they are in place when it reads them).
  Status SendLogits(uint32_t seq, int rows) {
    const Plan& plan = device_->plan();
    const int device = device_->device_id();
    if (device >= static_cast<int>(plan.vocab_chunks.size())) return Status::Ok();
    LogitsColumns out;
    out.seq = seq;
    out.rows = rows;
    out.vocab = config_.vocab_size;
    for (int chunk : plan.vocab_chunks[device]) {
      const int begin = plan.shape.ChunkBegin(chunk), end = plan.shape.ChunkEnd(chunk);
      if (!out.ranges.empty() && out.ranges.back().end == begin) {
        out.ranges.back().end = end;
      } else {
        out.ranges.push_back({begin, end});
      }
    }
    const auto* logits = static_cast<const float*>(logits_.data());
    for (const auto& [begin, end] : out.ranges) {
      for (int r = 0; r < rows; ++r) {
        const float* row = logits + static_cast<int64_t>(r) * config_.vocab_size;
        out.values.insert(out.values.end(), row + begin, row + end);
      }
    }
    return link_->Send(LinkOp::kLogits, out.Encode());
  }

  // Runs on the backup writer's thread after it copied a job into the
  // mirror: the same bytes and the published progress go up the link.
  void UploadBackup(const BackupLayout& layout, const BackupJob& job) {
    const int64_t row = static_cast<int64_t>(layout.header().head_dim) * layout.elem_bytes();
    const int bs = layout.header().block_size;
    const char* base = static_cast<const char*>(backup_.data());
    BackupUpload up;
    up.slot = job.slot;
    const BackupProgress* p = layout.Progress(backup_.data(), job.slot, device_->device_id());
    up.seq_id = p->seq_id.load(std::memory_order_acquire);
    up.tokens = p->tokens.load(std::memory_order_acquire);
    for (const BackupJob::Copy& c : job.copies) {
      const size_t n = static_cast<size_t>((c.to - c.from) * row);
      for (int part = 0; part < 2; ++part) {  // K, then V
        const char* src = c.dst + (part * bs + c.from) * row;
        up.ranges.emplace_back(static_cast<uint64_t>(src - base), std::string(src, n));
      }
    }
    // A lost upload means a lost coordinator: the link exits the process.
    (void)link_->Send(LinkOp::kBackup, up.Encode());
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
  RemoteWorkerLink* const link_ = nullptr;  // a device on another host: its link
  const std::string model_dir_;             // remote: the model's path on this host
  const std::string advertise_;             // remote: the address gloo peers dial
  std::vector<int> fds_;
  ModelConfig config_;
  std::unique_ptr<WeightStore> host_;
  // Mapped before the backend page-locks them (PinHostMemory) and
  // unmapped after it is gone (declared before it): its destructor stops
  // its locking of them and lets go of their locks while they are mapped.
  ShmRegion logits_;
  int64_t logits_rows_ = 0;
  ShmRegion backup_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceModel> device_;
  std::unique_ptr<Communicator> comm_;
  DeviceProgressRegion progress_;
  DeviceProgressSlot* progress_slot_ = nullptr;  // this device's, once initialised
  std::unique_ptr<BackupWriter> backup_writer_;  // destroyed before device_ (declared after)
};

}  // namespace

int RunJoinedWorker(const JoinedWorkerOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);
  JoinOptions j;
  j.coordinator = options.coordinator;
  j.token = options.token;
  auto link = RemoteWorkerLink::Join(j);
  if (!link.ok()) {
    FS_LOG_ERROR("{}", link.status().message());
    // A refusal is final; a coordinator out of reach may come back.
    return link.status().code() == StatusCode::kFailedPrecondition ? 1 : kLinkLostExitCode;
  }
  FS_LOG_INFO("joined {} as device {} (epoch {})", options.coordinator,
              (*link)->welcome().device_id, (*link)->welcome().epoch);
  Worker w(link->get(), options.model_dir, options.advertise);
  const int code = w.Run();
  return code;
}

int RunWorker(int control_fd) {
  // A device does not outlive its coordinator.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::signal(SIGPIPE, SIG_IGN);
  Worker w(control_fd);
  return w.Run();
}

}  // namespace failsafe
