// The coordinator's messages to a device survive their encoding: every
// value a flag can give them decodes as sent.
#include "worker/protocol.h"

#include <gtest/gtest.h>

namespace failsafe {
namespace {

TEST(WorkerInit, EveryGpuSettingRoundTrips) {
  for (GpuAttention a : {GpuAttention::kCores, GpuAttention::kTensor, GpuAttention::kSegments}) {
    for (GpuGemm g : {GpuGemm::kLt, GpuGemm::kFused, GpuGemm::kChain}) {
      for (uint8_t peer : {0, 1}) {
        WorkerInit in;
        in.model_dir = "/models/m";
        in.device_id = 5;
        in.gpu = 0;
        in.gpu_gemm = static_cast<int32_t>(g);
        in.gpu_attention = static_cast<int32_t>(a);
        in.kv_dtype = static_cast<int32_t>(DType::kBF16);
        in.peer_collectives = peer;
        WireWriter w;
        in.Encode(&w);
        WireReader r(w.data());
        WorkerInit out;
        ASSERT_TRUE(out.Decode(&r)) << static_cast<int>(a) << " " << static_cast<int>(g);
        EXPECT_EQ(out.gpu_attention, in.gpu_attention);
        EXPECT_EQ(out.gpu_gemm, in.gpu_gemm);
        EXPECT_EQ(out.peer_collectives, peer);
        EXPECT_EQ(out.model_dir, in.model_dir);
      }
    }
  }
}

TEST(WorkerInit, RefusesAnUnknownAttention) {
  WorkerInit in;
  in.gpu_attention = 3;
  WireWriter w;
  in.Encode(&w);
  WireReader r(w.data());
  WorkerInit out;
  EXPECT_FALSE(out.Decode(&r));
}

}  // namespace
}  // namespace failsafe
