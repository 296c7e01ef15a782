// The wire between a coordinator and the workers that join it over TCP from
// other hosts (`failsafe worker --join HOST:PORT`).
//
// A link opens with a handshake in which each side proves that it knows the
// cluster token without the token ever crossing the wire:
//
//   worker       -> coordinator  kHello: magic, protocol version, build id,
//                                host, pid and a fresh random nonce
//   coordinator  -> worker       kChallenge: the coordinator's own nonce and
//                                HMAC-SHA256(token, coordinator label, hello,
//                                coordinator nonce)
//   worker       -> coordinator  kProof: HMAC-SHA256(token, worker label,
//                                hello, coordinator nonce)
//
// Until the proof checks out neither side reads a frame larger than
// kMaxHandshakeFrame. The coordinator answers a hello of another protocol
// version, a wrong proof or another build with a refusal that says why, or,
// once it gives the worker a device id, a welcome carrying that id and the
// link's fencing epoch. Every later frame, both ways, starts with
// that epoch; a frame of another epoch (an older link of the same device) is
// dropped. The worker's requests and replies travel inside kRequest and
// kReply frames unchanged; what a local worker gets as shared memory travels
// as frames of its own: logits columns, KV backup bytes (up to the
// coordinator, and back down to restore), group aborts, heartbeats.
//
// Thread-safety: the functions here are pure, but for NewNonce (the system's
// random source) and ReadClusterToken (a file).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/wire.h"

namespace failsafe {

// Bumped whenever a frame or a worker message changes shape.
inline constexpr uint32_t kClusterProtocolVersion = 2;
inline constexpr uint64_t kClusterHelloMagic = 0x4653434c55535431ULL;  // "FSCLUST1"
// The largest frame either side reads before the peer has proven the token.
inline constexpr uint64_t kMaxHandshakeFrame = 1024;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // an HMAC-SHA256

enum class LinkOp : uint32_t {
  kHello = 1,        // worker -> coordinator: ClusterHello (no epoch)
  kWelcome = 2,      // coordinator -> worker: ClusterWelcome (no epoch)
  kRefused = 3,      // coordinator -> worker: the reason (no epoch); also
                     // worker -> coordinator for a challenge it cannot check
  kRequest = 4,      // coordinator -> worker: [u32 type][worker request payload]
  kReply = 5,        // worker -> coordinator: [u32 type][worker reply payload]
  kHeartbeat = 6,    // both ways; from the worker: its DeviceProgress counters
  kAbortGroup = 7,   // coordinator -> worker: [string group prefix]
  kLogits = 8,       // worker -> coordinator: LogitsColumns
  kBackup = 9,       // worker -> coordinator: BackupUpload
  kBackupFill = 10,  // coordinator -> worker: [u64 n][(u64 offset, string bytes) x n]
  kKill = 11,        // coordinator -> worker: die by SIGKILL now (fault injection)
  kIdle = 12,        // listener -> a worker waiting for a device id (no epoch)
  kChallenge = 13,   // coordinator -> worker: ClusterChallenge (no epoch)
  kProof = 14,       // worker -> coordinator: WorkerProof (no epoch)
};

struct ClusterHello {
  uint64_t magic = kClusterHelloMagic;
  uint32_t version = kClusterProtocolVersion;
  std::string build_id;
  std::string host;   // the worker's host name, for logs
  int64_t pid = 0;    // for logs
  std::string nonce;  // kNonceBytes, fresh for every connection

  std::string Encode() const;
  // Fails with a message naming what does not match this build's protocol.
  static Result<ClusterHello> Decode(const std::string& payload);
};

struct ClusterChallenge {
  std::string nonce;  // the coordinator's, kNonceBytes
  std::string proof;  // CoordinatorProof

  std::string Encode() const;
  bool Decode(const std::string& payload);
};

// Fresh random bytes from the system's source, for a nonce.
std::string NewNonce();
// What each side sends to prove it holds `token`, bound to this connection's
// hello (as the worker encoded it) and the coordinator's nonce. The two use
// different labels, so neither proof can be replayed as the other.
std::string CoordinatorProof(const std::string& token, const std::string& hello,
                             const std::string& coordinator_nonce);
std::string WorkerProof(const std::string& token, const std::string& hello,
                        const std::string& coordinator_nonce);

struct ClusterWelcome {
  int32_t device_id = 0;
  uint32_t epoch = 0;
  int64_t heartbeat_ms = 200;      // how often each side sends a heartbeat
  int64_t link_timeout_ms = 2000;  // silence after which the other side is gone

  std::string Encode() const;
  bool Decode(const std::string& payload);
};

// A frame after the welcome: the epoch, then the body.
std::string LinkFrame(uint32_t epoch, const std::string& body);
// Splits a frame; false if it is too short.
bool SplitLinkFrame(const std::string& payload, uint32_t* epoch, std::string* body);

// Columns [begin, end) of the logits.
struct ColumnRange {
  int32_t begin = 0, end = 0;
};

// The logits columns a device computed for one step, rows [0, rows).
struct LogitsColumns {
  uint32_t seq = 0;  // of the step request
  int32_t rows = 0;
  int32_t vocab = 0;
  std::vector<ColumnRange> ranges;  // ascending
  std::vector<float> values;        // per range: [rows, end - begin]

  std::string Encode() const;
  bool Decode(const std::string& payload);
};

// KV a device copied into its backup mirror: byte ranges of the blocks area
// (offsets from the region's base), then the request's published progress.
struct BackupUpload {
  int32_t slot = 0;
  int64_t seq_id = 0;
  int64_t tokens = 0;
  std::vector<std::pair<uint64_t, std::string>> ranges;  // (offset, bytes)

  std::string Encode() const;
  bool Decode(const std::string& payload);
};

// This program's build: a digest of its own executable, so that a worker and
// a coordinator agree on every message layout.
const std::string& ClusterBuildId();

// Compares tokens or proofs in time that does not depend on where they differ.
bool TokensEqual(const std::string& a, const std::string& b);

// The cluster token: the first line of `file` if given, else the environment
// variable FAILSAFE_CLUSTER_TOKEN. Fails if neither gives a non-empty token.
Result<std::string> ReadClusterToken(const std::string& file);

// Splits "HOST:PORT" ("[v6]:PORT" too).
Result<std::pair<std::string, int>> ParseHostPort(const std::string& text);

}  // namespace failsafe
