// Fixed-point item products on tensor cores (kernels.h: FixedItemsGemm):
// acc[m, n] += sum over items i of ToFixed(A[:, i * ik .. (i + 1) * ik)
// B_i^T), each item's product a chain of mma.sync m16n8k16 over its k-values
// in steps of 16, in increasing order, from zero.
//
// A thread block owns a tile of rows and columns and a run of items; for
// each item it runs the chain, converts it to fixed point and adds it to
// 64-bit sums in registers, then adds those to acc (atomically where other
// blocks take other items of the same tile: integer addition, so the order
// does not matter). An element's chain is the same whatever the tile sizes,
// the rows beside it or the items a block takes, so the result is the same
// bits for any m, any split of the items, and any set of items a device
// holds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace failsafe::cuda {
namespace {

__device__ __forceinline__ int64_t ToFixedDevice(float v) {
  if (!(v == v)) v = 0;
  v = v < -16777216.0f ? -16777216.0f : (v > 16777216.0f ? 16777216.0f : v);
  return static_cast<int64_t>(v * 4294967296.0f);
}

#ifdef FAILSAFE_CUDA_EMULATION
// The emulation's (emulation.h): the copies made at once, the fragments
// gathered from the warp's lanes.
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src, bool valid) {
  emu::CopyAsync16(dst, src, valid);
}
__device__ __forceinline__ void CommitAsync() {}
template <int N>
__device__ __forceinline__ void WaitAsync() {}
__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], const void* p) {
  emu::LoadMatrixX4(__LINE__, r, p);
}
template <bool kBf16>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  emu::Mma16816(__LINE__, d, a, b0, b1, kBf16);
}
#else
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; zeros where `valid` is false.
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)),
               "l"(src), "r"(bytes));
}
__device__ __forceinline__ void CommitAsync() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void WaitAsync() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

template <bool kBf16>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
#endif

// Warps kWarpsM x kWarpsN, each a tile of (16 kFm) x (8 kFn) (kFn even);
// kStages items' operands in shared memory at once (cp.async's pipeline).
// kA32: A is f32, rounded to 16 bits (to nearest even, as
// RoundActivations) as each warp takes its fragments from shared memory.
template <int kWarpsM, int kWarpsN, int kFm, int kFn, int kStages, bool kA32>
struct Tiles {
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBm = 16 * kFm * kWarpsM;
  static constexpr int kBn = 8 * kFn * kWarpsN;
  static_assert(kFn % 2 == 0 && kStages >= 2);
  // A stage's elements: its rows of A (floats where kA32, 16 bytes past the
  // item's k-values), then its columns of B.
  static __host__ __device__ int AElements(int ik) { return kBm * (kA32 ? 2 : 1) * (ik + 8); }
  static __host__ __device__ int StageElements(int ik) { return AElements(ik) + kBn * (ik + 8); }
};

// Elements in a shared row: an item's k-values and 8 more. For 16-bit
// values, rows 16 bytes apart in bank order (ldmatrix without conflicts);
// for f32 (kA32), rows 8 or 24 words apart modulo the 32 banks, so that a
// quarter warp's 8-byte reads of four rows (k-values 2 (lane % 4), rows
// lane / 4) fall in distinct banks.
__host__ __device__ constexpr int Pitch(int ik) { return ik + 8; }

// lo and hi rounded to 16 bits (to nearest even) and packed, lo in the low
// half: one conversion instruction for the pair.
template <bool kBf16>
__device__ __forceinline__ uint32_t Pack16(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return static_cast<uint32_t>(__bfloat16_as_ushort(v.x)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(v.y)) << 16);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return static_cast<uint32_t>(__half_as_ushort(v.x)) |
           (static_cast<uint32_t>(__half_as_ushort(v.y)) << 16);
  }
}

template <int kWarpsM, int kWarpsN, int kFm, int kFn, int kStages, bool kA32, bool kBf16>
__global__ void __launch_bounds__(32 * kWarpsM * kWarpsN)
    FixedItemsKernel(const void* a, int64_t lda, const uint16_t* b, int64_t* acc, int64_t ldacc,
                     int m, int n, int ik, int items, int items_per_block) {
  FS_KERNEL_PROLOGUE();
  using T = Tiles<kWarpsM, kWarpsN, kFm, kFn, kStages, kA32>;
  FS_DYNAMIC_SHARED(uint16_t, smem);
  const int pitch = Pitch(ik);  // elements, 16-bit or f32 (kA32's A)
  // Stage s: its rows of A, then its columns of B.
  auto stage_a = [&](int s) { return smem + s * T::StageElements(ik); };
  auto stage_b = [&](int s) { return stage_a(s) + T::AElements(ik); };
  const int row0 = blockIdx.y * T::kBm, col0 = blockIdx.x * T::kBn;
  const int first = blockIdx.z * items_per_block;
  const int last = min(items, first + items_per_block);
  if (first >= last) return;
  const int chunks = ik / 8;  // 16-byte chunks of a row of one item's 16-bit values
  const int chunks_a = kA32 ? ik / 4 : chunks;
  const int a_pitch = kA32 ? 2 * pitch : pitch;  // 16-bit elements between rows of A
  const int a_chunk = kA32 ? 4 : 8;              // A's values in 16 bytes
  const int a_bytes = kA32 ? 4 : 2;

  // Issues the copies of an item's operands into a stage (committed by the
  // caller: one group per item, empty past the last, so that waiting for
  // all but the newest kStages - 1 groups waits for the item wanted).
  auto load = [&](int item, int stage) {
    uint16_t* sa = stage_a(stage);
    uint16_t* sb = stage_b(stage);
    for (int e = threadIdx.x; e < T::kBm * chunks_a; e += T::kThreads) {
      const int r = e / chunks_a, c = e % chunks_a;
      const bool ok = row0 + r < m;
      const char* src =
          static_cast<const char*>(a) + ((ok ? static_cast<int64_t>(row0 + r) * lda : 0) +
                                         static_cast<int64_t>(item) * ik + c * a_chunk) *
                                            a_bytes;
      CopyAsync16(sa + r * a_pitch + c * 8, src, ok);
    }
    for (int e = threadIdx.x; e < T::kBn * chunks; e += T::kThreads) {
      const int r = e / chunks, c = e % chunks;
      const bool ok = col0 + r < n;
      const uint16_t* src = b + (static_cast<int64_t>(item) * n + (ok ? col0 + r : 0)) * ik + c * 8;
      CopyAsync16(sb + r * pitch + c * 8, src, ok);
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  float d[kFm][kFn][4];
  uint64_t sums[kFm][kFn][4];  // fixed point, wrapping (common/fixed_point.h: AddFixed)
#pragma unroll
  for (int i = 0; i < kFm; ++i)
#pragma unroll
    for (int j = 0; j < kFn; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) sums[i][j][q] = 0;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (first + s < last) load(first + s, s);
    CommitAsync();
  }
  for (int item = first; item < last; ++item) {
    const int at = item - first;
    // The stage read in the step before: every warp passed the barrier
    // that ended it.
    if (item + kStages - 1 < last) load(item + kStages - 1, (at + kStages - 1) % kStages);
    CommitAsync();
    WaitAsync<kStages - 1>();
    __syncthreads();
    const uint16_t* sa = stage_a(at % kStages);
    const uint16_t* sb = stage_b(at % kStages);
#pragma unroll
    for (int i = 0; i < kFm; ++i)
#pragma unroll
      for (int j = 0; j < kFn; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) d[i][j][q] = 0.0f;
    for (int ks = 0; ks < ik; ks += 16) {
      uint32_t af[kFm][4];
#pragma unroll
      for (int i = 0; i < kFm; ++i) {
        if constexpr (kA32) {
          // The fragment ldmatrix would give: rows lane / 4 and 8 more,
          // columns 2 (lane % 4) and 8 more, each pair packed low first.
          // Pairs read as one 8-byte value (an even element of a row).
          const float2* f = reinterpret_cast<const float2*>(
              reinterpret_cast<const float*>(sa) + (wm * 16 * kFm + i * 16 + lane / 4) * pitch +
              ks + (lane % 4) * 2);
          const float2 v0 = f[0], v1 = f[4 * pitch], v2 = f[4], v3 = f[4 * pitch + 4];
          af[i][0] = Pack16<kBf16>(v0.x, v0.y);
          af[i][1] = Pack16<kBf16>(v1.x, v1.y);
          af[i][2] = Pack16<kBf16>(v2.x, v2.y);
          af[i][3] = Pack16<kBf16>(v3.x, v3.y);
        } else {
          const int r = wm * 16 * kFm + i * 16 + lane % 16;
          LoadMatrixX4(af[i], sa + r * pitch + ks + (lane / 16) * 8);
        }
      }
#pragma unroll
      for (int j = 0; j < kFn; j += 2) {
        uint32_t bf[4];
        const int r = wn * 8 * kFn + j * 8 + lane % 8 + (lane / 16) * 8;
        LoadMatrixX4(bf, sb + r * pitch + ks + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int i = 0; i < kFm; ++i) {
          Mma<kBf16>(d[i][j], af[i], bf[0], bf[1]);
          Mma<kBf16>(d[i][j + 1], af[i], bf[2], bf[3]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kFm; ++i)
#pragma unroll
      for (int j = 0; j < kFn; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          sums[i][j][q] += static_cast<uint64_t>(ToFixedDevice(d[i][j][q]));
    __syncthreads();  // the stage is read before a later load overwrites it
  }

  const bool shared_tile = gridDim.z > 1;
#pragma unroll
  for (int i = 0; i < kFm; ++i) {
#pragma unroll
    for (int j = 0; j < kFn; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int r = row0 + wm * 16 * kFm + i * 16 + lane / 4 + (q >= 2 ? 8 : 0);
        const int c = col0 + wn * 8 * kFn + j * 8 + (lane % 4) * 2 + (q % 2);
        if (r >= m || c >= n) continue;
        int64_t* dst = acc + static_cast<int64_t>(r) * ldacc + c;
        if (shared_tile) {
          atomicAdd(reinterpret_cast<unsigned long long*>(dst),
                    static_cast<unsigned long long>(sums[i][j][q]));
        } else {
          *dst = static_cast<int64_t>(static_cast<uint64_t>(*dst) + sums[i][j][q]);
        }
      }
    }
  }
}

template <int kWarpsM, int kWarpsN, int kFm, int kFn, int kStages, bool kA32>
size_t SharedBytes(int item_k) {
  using T = Tiles<kWarpsM, kWarpsN, kFm, kFn, kStages, kA32>;
  return sizeof(uint16_t) * kStages * T::StageElements(item_k);
}

template <int kWarpsM, int kWarpsN, int kFm, int kFn, int kStages, bool kA32>
void Launch(const FixedItems& g, int blocks_per_sm, int sms, cudaStream_t s) {
  using T = Tiles<kWarpsM, kWarpsN, kFm, kFn, kStages, kA32>;
  FS_CHECK_MSG((g.a32 != nullptr) == kA32, "fixed-point items with A of the variant's other type");
  const size_t shared = SharedBytes<kWarpsM, kWarpsN, kFm, kFn, kStages, kA32>(g.item_k);
  auto kernel = g.bf16 ? FixedItemsKernel<kWarpsM, kWarpsN, kFm, kFn, kStages, kA32, true>
                       : FixedItemsKernel<kWarpsM, kWarpsN, kFm, kFn, kStages, kA32, false>;
  // Shared memory past 48 KiB is asked for per kernel (one GPU per
  // process), raised to the most a launch has needed.
  static size_t raised[2] = {0, 0};
  if (shared > 48 * 1024 && shared > raised[g.bf16]) {
    FS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared)));
    raised[g.bf16] = shared;
  }
  // The blocks a multiprocessor holds at once at this item size (its
  // shared memory and registers), the variant's `blocks_per_sm` at most.
  static size_t resident_at[2] = {0, 0};
  static int resident[2] = {0, 0};
  if (resident_at[g.bf16] != shared) {
    int blocks = 0;
    FS_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, T::kThreads, shared));
    resident[g.bf16] = blocks;
    resident_at[g.bf16] = shared;
  }
  const int per_sm = std::max(1, std::min(blocks_per_sm, resident[g.bf16]));
  const int tiles_n = (g.n + T::kBn - 1) / T::kBn, tiles_m = (g.m + T::kBm - 1) / T::kBm;
  // Enough blocks for that many per multiprocessor: the items split over
  // blocks.
  const int want = per_sm * sms, tiles = tiles_n * tiles_m;
  int groups = tiles >= want ? 1 : (want + tiles - 1) / tiles;
  groups = groups < g.items ? groups : g.items;
  const int per = (g.items + groups - 1) / groups;
  groups = (g.items + per - 1) / per;
  dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m),
            static_cast<unsigned>(groups));
  FS_CHECK(tiles_m <= 65535 && groups <= 65535);
  FS_LAUNCH(grid, T::kThreads, shared, s, kernel)
  (kA32 ? static_cast<const void*>(g.a32) : g.a, g.lda, g.b, g.acc, g.ldacc, g.m, g.n, g.item_k,
   g.items, per);
  FS_CUDA_CHECK(cudaGetLastError());
}

// The ways to launch it; every one gives the same bits.
struct Variant {
  const char* name;
  size_t (*shared)(int item_k);
  void (*launch)(const FixedItems& g, int blocks_per_sm, int sms, cudaStream_t s);
  int blocks_per_sm;
  bool a32;
};

#define FS_FIXED_VARIANT(name, wm, wn, fm, fn, stages, bps)                                       \
  {                                                                                               \
    name, SharedBytes<wm, wn, fm, fn, stages, false>, Launch<wm, wn, fm, fn, stages, false>, bps, \
        false                                                                                     \
  }
#define FS_FIXED_VARIANT_A32(name, wm, wn, fm, fn, stages, bps)                                 \
  {                                                                                             \
    name, SharedBytes<wm, wn, fm, fn, stages, true>, Launch<wm, wn, fm, fn, stages, true>, bps, \
        true                                                                                    \
  }

// Names: "a32" where A is f32, rows x columns of a block's tile, pipeline
// stages, blocks per multiprocessor the items are split to fill. The
// defaults (FixedItemsDefault) fit every item size in a Hopper block's
// shared memory (FixedGemm takes a smaller one where a GPU has less).
const Variant kVariants[] = {
    FS_FIXED_VARIANT("16x64 s2 b2", 1, 4, 1, 2, 2, 2),
    FS_FIXED_VARIANT("16x64 s4 b2", 1, 4, 1, 2, 4, 2),
    FS_FIXED_VARIANT("16x64 s3 b4", 1, 4, 1, 2, 3, 4),
    FS_FIXED_VARIANT("16x128 s3 b2", 1, 4, 1, 4, 3, 2),
    FS_FIXED_VARIANT("16x32 s4 b4", 1, 2, 1, 2, 4, 4),
    FS_FIXED_VARIANT("32x64 s3 b2", 2, 2, 1, 4, 3, 2),
    FS_FIXED_VARIANT("64x128 s2 b2", 2, 4, 2, 4, 2, 2),
    FS_FIXED_VARIANT("64x128 s3 b2", 2, 4, 2, 4, 3, 2),
    FS_FIXED_VARIANT("128x128 s2 b1", 2, 4, 4, 4, 2, 1),
    FS_FIXED_VARIANT("128x64 s3 b2", 4, 2, 2, 4, 3, 2),
    FS_FIXED_VARIANT("64x64 s3 b4", 2, 2, 2, 4, 3, 4),
    FS_FIXED_VARIANT_A32("a32 16x64 s2 b2", 1, 4, 1, 2, 2, 2),
    FS_FIXED_VARIANT_A32("a32 16x64 s4 b2", 1, 4, 1, 2, 4, 2),
    FS_FIXED_VARIANT_A32("a32 16x64 s3 b4", 1, 4, 1, 2, 3, 4),
    FS_FIXED_VARIANT_A32("a32 16x128 s3 b2", 1, 4, 1, 4, 3, 2),
    FS_FIXED_VARIANT_A32("a32 16x32 s4 b4", 1, 2, 1, 2, 4, 4),
};
#undef FS_FIXED_VARIANT
#undef FS_FIXED_VARIANT_A32
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);
constexpr int kDecode = 0, kPrefill = 6, kDecodeA32 = 11;

}  // namespace

bool FixedItemsSupported(int item_k, int64_t lda, const void* a, const void* b, bool a32) {
  return item_k % 16 == 0 && item_k <= 256 && lda % (a32 ? 4 : 8) == 0 &&
         reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

int FixedItemsVariants() { return kNumVariants; }

const char* FixedItemsVariantName(int v) {
  FS_CHECK(v >= 0 && v < kNumVariants);
  return kVariants[v].name;
}

size_t FixedItemsShared(int v, int item_k) {
  FS_CHECK(v >= 0 && v < kNumVariants);
  return kVariants[v].shared(item_k);
}

bool FixedItemsTakesF32(int v) {
  FS_CHECK(v >= 0 && v < kNumVariants);
  return kVariants[v].a32;
}

int FixedItemsDefault(int m, bool a32) { return a32 ? kDecodeA32 : m <= 16 ? kDecode : kPrefill; }

void FixedItemsGemm(const FixedItems& g, int variant, int sms, cudaStream_t s) {
  if (g.m <= 0 || g.n <= 0 || g.items <= 0) return;
  FS_CHECK(FixedItemsSupported(g.item_k, g.lda, g.a32 ? static_cast<const void*>(g.a32) : g.a, g.b,
                               g.a32 != nullptr));
  FS_CHECK(variant >= 0 && variant < kNumVariants);
  const Variant& v = kVariants[variant];
  v.launch(g, v.blocks_per_sm, sms, s);
}

}  // namespace failsafe::cuda
