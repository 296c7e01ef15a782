// Fuzzes what the cluster port reads from peers: frames reassembled the way
// the listener reads them before a peer has proven the token (in pieces of
// the sizes the input gives), and every cluster message decoder on their
// bodies.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/channel.h"
#include "worker/cluster_protocol.h"

using namespace failsafe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  FrameReader frame(kMaxHandshakeFrame);
  size_t pos = 0;
  while (pos < size) {
    // The first byte of each piece says how much the socket yields.
    const size_t piece = static_cast<uint8_t>(p[pos++]) + 1;
    size_t n = std::min({piece, size - pos, frame.Want()});
    if (frame.Want() == 0 && !frame.done()) break;  // refused for good
    if (!frame.Add(p + pos, n).ok()) {
      // Nothing may be buffered for a refused header.
      if (frame.payload().capacity() > kMaxHandshakeFrame) __builtin_trap();
      break;
    }
    pos += n;
    if (frame.payload().size() > kMaxHandshakeFrame) __builtin_trap();
    if (!frame.done()) continue;
    const std::string& body = frame.payload();
    if (auto hello = ClusterHello::Decode(body); hello.ok()) {
      if (hello->nonce.size() != kNonceBytes) __builtin_trap();
      // What decodes encodes to itself.
      if (ClusterHello::Decode(hello->Encode())->Encode() != hello->Encode()) __builtin_trap();
    }
    ClusterChallenge challenge;
    if (challenge.Decode(body) && challenge.proof.size() != kProofBytes) __builtin_trap();
    ClusterWelcome welcome;
    (void)welcome.Decode(body);
    uint32_t epoch = 0;
    std::string inner;
    if (SplitLinkFrame(body, &epoch, &inner)) {
      LogitsColumns logits;
      if (logits.Decode(inner)) {
        size_t want = 0;
        for (const auto& r : logits.ranges)
          want += static_cast<size_t>(logits.rows) * (r.end - r.begin);
        if (want != logits.values.size()) __builtin_trap();
      }
      BackupUpload backup;
      (void)backup.Decode(inner);
    }
    frame.Reset();
  }
  return 0;
}
