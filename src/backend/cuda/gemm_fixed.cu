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

// Warps kWarpsM x kWarpsN, each a tile of (16 kFm) x (8 kFn) (kFn even).
template <int kWarpsM, int kWarpsN, int kFm, int kFn>
struct Tiles {
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBm = 16 * kFm * kWarpsM;
  static constexpr int kBn = 8 * kFn * kWarpsN;
};

// Elements of 16-bit values in a shared row: an item's k-values and 8 more
// (rows 16 bytes apart in bank order: ldmatrix without conflicts).
__host__ __device__ constexpr int Pitch(int ik) { return ik + 8; }

template <int kWarpsM, int kWarpsN, int kFm, int kFn, bool kBf16>
__global__ void __launch_bounds__(32 * kWarpsM * kWarpsN)
    FixedItemsKernel(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t* acc, int64_t ldacc,
                     int m, int n, int ik, int items, int items_per_block) {
  using T = Tiles<kWarpsM, kWarpsN, kFm, kFn>;
  FS_DYNAMIC_SHARED(uint16_t, smem);
  const int pitch = Pitch(ik);
  uint16_t* sa[2] = {smem, smem + T::kBm * pitch};
  uint16_t* sb[2] = {smem + 2 * T::kBm * pitch, smem + 2 * T::kBm * pitch + T::kBn * pitch};
  const int row0 = blockIdx.y * T::kBm, col0 = blockIdx.x * T::kBn;
  const int first = blockIdx.z * items_per_block;
  const int last = min(items, first + items_per_block);
  if (first >= last) return;
  const int chunks = ik / 8;  // 16-byte chunks of a row of one item

  auto load = [&](int item, int stage) {
    for (int e = threadIdx.x; e < T::kBm * chunks; e += T::kThreads) {
      const int r = e / chunks, c = e % chunks;
      const bool ok = row0 + r < m;
      const uint16_t* src = a + (ok ? static_cast<int64_t>(row0 + r) * lda : 0) +
                            static_cast<int64_t>(item) * ik + c * 8;
      CopyAsync16(sa[stage] + r * pitch + c * 8, src, ok);
    }
    for (int e = threadIdx.x; e < T::kBn * chunks; e += T::kThreads) {
      const int r = e / chunks, c = e % chunks;
      const bool ok = col0 + r < n;
      const uint16_t* src = b + (static_cast<int64_t>(item) * n + (ok ? col0 + r : 0)) * ik + c * 8;
      CopyAsync16(sb[stage] + r * pitch + c * 8, src, ok);
    }
    CommitAsync();
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

  load(first, 0);
  for (int item = first; item < last; ++item) {
    const int stage = (item - first) % 2;
    if (item + 1 < last) {
      load(item + 1, 1 - stage);
      WaitAsync<1>();
    } else {
      WaitAsync<0>();
    }
    __syncthreads();
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
        const int r = wm * 16 * kFm + i * 16 + lane % 16;
        LoadMatrixX4(af[i], sa[stage] + r * pitch + ks + (lane / 16) * 8);
      }
#pragma unroll
      for (int j = 0; j < kFn; j += 2) {
        uint32_t bf[4];
        const int r = wn * 8 * kFn + j * 8 + lane % 8 + (lane / 16) * 8;
        LoadMatrixX4(bf, sb[stage] + r * pitch + ks + ((lane / 8) % 2) * 8);
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
    __syncthreads();  // the stage is read before the next load overwrites it
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

template <int kWarpsM, int kWarpsN, int kFm, int kFn>
void Launch(const FixedItems& g, int sms, cudaStream_t s) {
  using T = Tiles<kWarpsM, kWarpsN, kFm, kFn>;
  const int tiles_n = (g.n + T::kBn - 1) / T::kBn, tiles_m = (g.m + T::kBm - 1) / T::kBm;
  // Enough blocks for two per multiprocessor: the items split over blocks.
  const int want = 2 * sms, tiles = tiles_n * tiles_m;
  int groups = tiles >= want ? 1 : (want + tiles - 1) / tiles;
  groups = groups < g.items ? groups : g.items;
  const int per = (g.items + groups - 1) / groups;
  groups = (g.items + per - 1) / per;
  const size_t shared = sizeof(uint16_t) * 2 * (T::kBm + T::kBn) * Pitch(g.item_k);
  dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m),
            static_cast<unsigned>(groups));
  FS_CHECK(tiles_m <= 65535 && groups <= 65535);
  auto kernel = g.bf16 ? FixedItemsKernel<kWarpsM, kWarpsN, kFm, kFn, true>
                       : FixedItemsKernel<kWarpsM, kWarpsN, kFm, kFn, false>;
  // Shared memory past 48 KiB is asked for once per kernel (one GPU per
  // process), up to the most any item size needs.
  static bool raised[2] = {false, false};
  if (!raised[g.bf16]) {
    const size_t most = sizeof(uint16_t) * 2 * (T::kBm + T::kBn) * Pitch(256);
    FS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(most)));
    raised[g.bf16] = true;
  }
  FS_LAUNCH(grid, T::kThreads, shared, s, kernel)
  (g.a, g.lda, g.b, g.acc, g.ldacc, g.m, g.n, g.item_k, g.items, per);
  FS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool FixedItemsSupported(int item_k, int64_t lda, const void* a, const void* b) {
  return item_k % 16 == 0 && item_k <= 256 && lda % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

void FixedItemsGemm(const FixedItems& g, int sms, cudaStream_t s) {
  if (g.m <= 0 || g.n <= 0 || g.items <= 0) return;
  FS_CHECK(FixedItemsSupported(g.item_k, g.lda, g.a, g.b));
  if (g.m <= 16) {
    Launch<1, 4, 1, 2>(g, sms, s);  // 16 x 64 tiles: decode
  } else {
    Launch<2, 4, 2, 4>(g, sms, s);  // 64 x 128 tiles
  }
}

}  // namespace failsafe::cuda
