#include "worker/cluster_protocol.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace failsafe {

std::string ClusterHello::Encode() const {
  WireWriter w;
  w.Put(magic);
  w.Put(version);
  w.PutString(build_id);
  w.PutString(host);
  w.Put(pid);
  w.PutString(nonce);
  return w.Take();
}

Result<ClusterHello> ClusterHello::Decode(const std::string& payload) {
  WireReader r(payload);
  ClusterHello h;
  h.magic = r.Get<uint64_t>();
  h.version = r.Get<uint32_t>();
  if (!r.ok() || h.magic != kClusterHelloMagic) {
    return InvalidArgument("not a FailSafe worker (no cluster hello)");
  }
  // The rest of a hello of another version may have another shape.
  if (h.version != kClusterProtocolVersion) {
    return FailedPrecondition("the worker speaks cluster protocol version {}, this build speaks {}",
                              h.version, kClusterProtocolVersion);
  }
  h.build_id = r.GetString();
  h.host = r.GetString();
  h.pid = r.Get<int64_t>();
  h.nonce = r.GetString();
  if (!r.ok() || h.nonce.size() != kNonceBytes || h.build_id.size() > 64 || h.host.size() > 255) {
    return InvalidArgument("malformed cluster hello");
  }
  return h;
}

std::string ClusterChallenge::Encode() const {
  WireWriter w;
  w.PutString(nonce);
  w.PutString(proof);
  return w.Take();
}

bool ClusterChallenge::Decode(const std::string& payload) {
  WireReader r(payload);
  nonce = r.GetString();
  proof = r.GetString();
  return r.ok() && nonce.size() == kNonceBytes && proof.size() == kProofBytes;
}

std::string NewNonce() {
  std::string nonce(kNonceBytes, '\0');
  size_t got = 0;
  while (got < nonce.size()) {
    const ssize_t n = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    // The kernel's source does not fail once it is seeded, which it is long
    // before a serving process starts.
    if (n < 0) throw std::runtime_error("getrandom failed");
    got += static_cast<size_t>(n);
  }
  return nonce;
}

namespace {

std::string Proof(const char* label, const std::string& token, const std::string& hello,
                  const std::string& coordinator_nonce) {
  WireWriter w;
  w.PutString(label);
  w.PutString(hello);
  w.PutString(coordinator_nonce);
  const std::string& message = w.data();
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

}  // namespace

std::string CoordinatorProof(const std::string& token, const std::string& hello,
                             const std::string& coordinator_nonce) {
  return Proof("failsafe cluster coordinator", token, hello, coordinator_nonce);
}

std::string WorkerProof(const std::string& token, const std::string& hello,
                        const std::string& coordinator_nonce) {
  return Proof("failsafe cluster worker", token, hello, coordinator_nonce);
}

std::string ClusterWelcome::Encode() const {
  WireWriter w;
  w.Put(device_id);
  w.Put(epoch);
  w.Put(heartbeat_ms);
  w.Put(link_timeout_ms);
  return w.Take();
}

bool ClusterWelcome::Decode(const std::string& payload) {
  WireReader r(payload);
  device_id = r.Get<int32_t>();
  epoch = r.Get<uint32_t>();
  heartbeat_ms = r.Get<int64_t>();
  link_timeout_ms = r.Get<int64_t>();
  return r.ok() && device_id >= 0 && heartbeat_ms > 0 && link_timeout_ms > heartbeat_ms;
}

std::string LinkFrame(uint32_t epoch, const std::string& body) {
  std::string out(sizeof(epoch), '\0');
  std::memcpy(out.data(), &epoch, sizeof(epoch));
  out += body;
  return out;
}

bool SplitLinkFrame(const std::string& payload, uint32_t* epoch, std::string* body) {
  if (payload.size() < sizeof(uint32_t)) return false;
  std::memcpy(epoch, payload.data(), sizeof(uint32_t));
  body->assign(payload, sizeof(uint32_t));
  return true;
}

std::string LogitsColumns::Encode() const {
  WireWriter w;
  w.Put(seq);
  w.Put(rows);
  w.Put(vocab);
  w.PutVector(ranges);
  w.PutVector(values);
  return w.Take();
}

bool LogitsColumns::Decode(const std::string& payload) {
  WireReader r(payload);
  seq = r.Get<uint32_t>();
  rows = r.Get<int32_t>();
  vocab = r.Get<int32_t>();
  ranges = r.GetVector<ColumnRange>();
  values = r.GetVector<float>();
  if (!r.ok() || rows < 0 || vocab <= 0) return false;
  int64_t want = 0, prev_end = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin < prev_end || end <= begin || end > vocab) return false;
    want += static_cast<int64_t>(rows) * (end - begin);
    prev_end = end;
  }
  return want == static_cast<int64_t>(values.size());
}

std::string BackupUpload::Encode() const {
  WireWriter w;
  w.Put(slot);
  w.Put(seq_id);
  w.Put(tokens);
  w.Put<uint64_t>(ranges.size());
  for (const auto& [offset, bytes] : ranges) {
    w.Put(offset);
    w.PutString(bytes);
  }
  return w.Take();
}

bool BackupUpload::Decode(const std::string& payload) {
  WireReader r(payload);
  slot = r.Get<int32_t>();
  seq_id = r.Get<int64_t>();
  tokens = r.Get<int64_t>();
  const uint64_t n = r.Get<uint64_t>();
  if (!r.ok() || n > payload.size()) return false;
  ranges.resize(n);
  for (auto& [offset, bytes] : ranges) {
    offset = r.Get<uint64_t>();
    bytes = r.GetString();
  }
  return r.ok();
}

const std::string& ClusterBuildId() {
  // A digest of the sources that define every message layout, the compiler
  // and the architecture (src/worker/CMakeLists.txt computes it).
  static const std::string id = FAILSAFE_WIRE_BUILD_ID;
  return id;
}

bool TokensEqual(const std::string& a, const std::string& b) {
  // Every byte of the longer one is looked at, whatever differs first.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

Result<std::string> ReadClusterToken(const std::string& file) {
  std::string token;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return NotFound("cannot read the cluster token file {}", file);
    std::getline(in, token);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
    if (token.empty()) return InvalidArgument("the cluster token file {} is empty", file);
    return token;
  }
  if (const char* env = std::getenv("FAILSAFE_CLUSTER_TOKEN"); env && *env) return std::string(env);
  return InvalidArgument(
      "a cluster needs a token: --cluster-token-file FILE or FAILSAFE_CLUSTER_TOKEN");
}

Result<std::pair<std::string, int>> ParseHostPort(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("'{}' is not HOST:PORT", text);
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  for (char c : text.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) return InvalidArgument("'{}': bad port", text);
    port = port * 10 + (c - '0');
  }
  if (port > 65535) return InvalidArgument("'{}': bad port", text);
  return std::make_pair(host, port);
}

}  // namespace failsafe
