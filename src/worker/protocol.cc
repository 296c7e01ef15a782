#include "worker/protocol.h"

namespace failsafe {

void WorkerInit::Encode(WireWriter* w) const {
  w->Put(protocol_version);
  w->PutString(model_dir);
  w->Put(device_id);
  w->Put(threads);
  w->Put(block_size);
  w->Put(kv_pages);
  w->Put(logits_rows);
  w->Put(gpu);
  w->Put(gpu_gemm);
  w->Put(gpu_graphs);
  w->Put(kv_dtype);
  w->Put(gpu_attention);
  w->Put(peer_collectives);
  w->Put(gpu_dependent_launch);
}

bool WorkerInit::Decode(WireReader* r) {
  protocol_version = r->Get<int32_t>();
  if (!r->ok() || protocol_version != kWorkerProtocolVersion) return false;
  model_dir = r->GetString();
  device_id = r->Get<int32_t>();
  threads = r->Get<int32_t>();
  block_size = r->Get<int32_t>();
  kv_pages = r->Get<int64_t>();
  logits_rows = r->Get<int64_t>();
  gpu = r->Get<int32_t>();
  gpu_gemm = r->Get<int32_t>();
  gpu_graphs = r->Get<uint8_t>();
  kv_dtype = r->Get<int32_t>();
  gpu_attention = r->Get<int32_t>();
  peer_collectives = r->Get<uint8_t>();
  gpu_dependent_launch = r->Get<uint8_t>();
  return r->ok() && gpu_gemm >= 0 && gpu_gemm <= 2 && gpu_attention >= 0 && gpu_attention <= 2 &&
         (kv_dtype == static_cast<int32_t>(DType::kF32) ||
          kv_dtype == static_cast<int32_t>(DType::kBF16));
}

void GroupSpec::Encode(WireWriter* w) const {
  w->Put(kind);
  w->Put(rank);
  w->Put(size);
  w->Put(timeout_ms);
  w->PutString(store_host);
  w->Put(store_port);
  w->PutString(prefix);
  w->PutString(hostname);
}

bool GroupSpec::Decode(WireReader* r) {
  kind = r->Get<CommKind>();
  rank = r->Get<int32_t>();
  size = r->Get<int32_t>();
  timeout_ms = r->Get<int64_t>();
  store_host = r->GetString();
  store_port = r->Get<int32_t>();
  prefix = r->GetString();
  hostname = r->GetString();
  return r->ok();
}

void ApplyPlanRequest::Encode(WireWriter* w) const {
  w->PutString(prev_plan_json);
  w->PutString(next_plan_json);
  w->Put(mode);
  w->Put<uint64_t>(seqs.size());
  for (const SeqRestore& s : seqs) {
    w->Put(s.seq_id);
    w->Put(s.dp_rank);
    w->Put(s.restore_tokens);
    w->Put(s.restore_from);
    w->Put(s.shared_blocks);
    w->PutVector(s.backup_blocks);
    w->Put(s.num_blocks);
    w->PutVector(s.pages);
    w->PutVector(s.restore_slots);
  }
}

bool ApplyPlanRequest::Decode(WireReader* r) {
  prev_plan_json = r->GetString();
  next_plan_json = r->GetString();
  mode = r->Get<int32_t>();
  const uint64_t n = r->Get<uint64_t>();
  if (!r->ok() || n > (1u << 24)) return false;
  seqs.resize(n);
  for (SeqRestore& s : seqs) {
    s.seq_id = r->Get<int64_t>();
    s.dp_rank = r->Get<int32_t>();
    s.restore_tokens = r->Get<int32_t>();
    s.restore_from = r->Get<int32_t>();
    s.shared_blocks = r->Get<int32_t>();
    s.backup_blocks = r->GetVector<int32_t>();
    s.num_blocks = r->Get<int32_t>();
    s.pages = r->GetVector<int32_t>();
    s.restore_slots = r->GetVector<int32_t>();
    if (!r->ok()) return false;
  }
  return r->ok();
}

void EncodeApplyStats(const ApplyStats& s, WireWriter* w) { w->Put(s); }

bool DecodeApplyStats(WireReader* r, ApplyStats* s) {
  *s = r->Get<ApplyStats>();
  return r->ok();
}

void EncodeBatch(const StepBatch& b, int device, WireWriter* w) {
  w->PutVector(b.seqs);
  w->PutVector(b.tokens);
  w->Put(b.num_logits_rows);
  w->PutVector(b.backup_blocks);
  static const KvTableUpdate kNone;
  const KvTableUpdate& kv =
      device >= 0 && device < static_cast<int>(b.kv.size()) ? b.kv[device] : kNone;
  w->PutVector(kv.runs);
  w->PutVector(kv.pages);
}

bool DecodeBatch(WireReader* r, int device, StepBatch* b) {
  b->seqs = r->GetVector<StepSeq>();
  b->tokens = r->GetVector<int32_t>();
  b->num_logits_rows = r->Get<int32_t>();
  b->backup_blocks = r->GetVector<int32_t>();
  if (device < 0 || device >= (1 << 16)) return false;
  b->kv.assign(device + 1, {});
  b->kv[device].runs = r->GetVector<KvBlockRun>();
  b->kv[device].pages = r->GetVector<int32_t>();
  return r->ok();
}

void EncodeStats(const ForwardStats& s, WireWriter* w) {
  w->PutVector(s.segment_cpu_ns);
  w->PutVector(s.segment_wall_ns);
  w->Put(s.collective_wall_ns);
  w->Put(s.attention_flops);
  w->Put(s.ffn_flops);
  w->Put(s.other_flops);
  w->Put(s.kv_bytes);
}

bool DecodeStats(WireReader* r, ForwardStats* s) {
  s->segment_cpu_ns = r->GetVector<int64_t>();
  s->segment_wall_ns = r->GetVector<int64_t>();
  s->collective_wall_ns = r->Get<int64_t>();
  s->attention_flops = r->Get<double>();
  s->ffn_flops = r->Get<double>();
  s->other_flops = r->Get<double>();
  s->kv_bytes = r->Get<int64_t>();
  return r->ok();
}

std::string EncodeReply(const Status& st, const std::string& body) {
  WireWriter w;
  w.Put(static_cast<int32_t>(st.code()));
  w.PutString(st.message());
  std::string out = w.Take();
  out += body;
  return out;
}

Status DecodeReply(const std::string& payload, std::string* body) {
  WireReader r(payload);
  auto code = static_cast<StatusCode>(r.Get<int32_t>());
  std::string msg = r.GetString();
  if (!r.ok()) return Internal("malformed reply from worker");
  // The body is what follows the status.
  size_t header = sizeof(int32_t) + sizeof(uint64_t) + msg.size();
  if (body) *body = payload.substr(header);
  if (code == StatusCode::kOk) return Status::Ok();
  return Status(code, msg);
}

}  // namespace failsafe
