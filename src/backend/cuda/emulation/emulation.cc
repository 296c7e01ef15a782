// The CPU emulation of the CUDA execution model (emulation.h): a block's
// threads as fibers of the calling thread, each on a stack of its own, run
// a warp at a time until each waits at a barrier or returns; and the few
// runtime calls the kernels' launch functions make.
#include "backend/cuda/emulation/emulation.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"

namespace failsafe::cuda::emu {
namespace {

constexpr size_t kStackBytes = 256 << 10;
constexpr size_t kDefaultShared = 48 << 10;  // a launch's without cudaFuncSetAttribute
constexpr size_t kSlotBytes = 64;            // a lane's operands of one warp operation, at most

enum class Wait { kNone, kBlock, kWarp, kDone };

// A fiber's saved context. On x86-64 the switch is the few instructions
// below (callee-saved registers, the SSE and x87 control words, the stack
// pointer), not swapcontext, which also saves the signal mask by a system
// call each time: the emulated attention tests switch millions of times.
#if defined(__x86_64__)
extern "C" void FsEmuSwitch(void** save_sp, void* to_sp);
asm(R"(
  .text
  .globl FsEmuSwitch
  .type FsEmuSwitch, @function
FsEmuSwitch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size FsEmuSwitch, .-FsEmuSwitch
  .section .note.GNU-stack, "", @progbits
  .text
)");
struct Context {
  void* sp = nullptr;
};
void SwitchTo(Context* save, Context* to) { FsEmuSwitch(&save->sp, to->sp); }
#else
struct Context {
  ucontext_t uc{};
};
void SwitchTo(Context* save, Context* to) { swapcontext(&save->uc, &to->uc); }
#endif

struct Fiber {
  Context context;
  char* stack = nullptr;  // kStackBytes
  Coordinates at;
  Wait wait = Wait::kNone;
  int site = 0;           // the warp operation it waits at
  uint64_t warp_ops = 0;  // warp operations it passed
  bool prologue = false;  // passed FS_KERNEL_PROLOGUE
};

struct Block {
  std::vector<Fiber> fibers;
  int current = -1;
  Context scheduler;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> shared;
  // Per warp, two sets taken in turn (WarpExchange): each lane's
  // contribution to a warp operation.
  std::vector<std::vector<unsigned char>> slots;
};

thread_local Block* g_block = nullptr;  // the block this thread runs (one at a time)
const Coordinates g_host;               // what Self() answers outside a kernel

// Raised limits of dynamic shared memory, by kernel (cudaFuncSetAttribute).
// (Never destroyed, as the runtime's tables: runtime.cc.)
std::map<const void*, size_t>& SharedLimits() {
  static auto* limits = new std::map<const void*, size_t>();
  return *limits;
}

Fiber& Current() {
  FS_CHECK_MSG(g_block && g_block->current >= 0, "a device function called outside a kernel");
  return g_block->fibers[static_cast<size_t>(g_block->current)];
}

// Back to the scheduler until released.
void Yield(Wait w, int site) {
  Fiber& f = Current();
  f.wait = w;
  f.site = site;
  SwitchTo(&f.context, &g_block->scheduler);
}

// A fiber's life: the kernel, then back to the scheduler for good.
void Entry() {
  (*g_block->body)();
  Fiber& f = Current();
  f.wait = Wait::kDone;
  SwitchTo(&f.context, &g_block->scheduler);
  FS_CHECK_MSG(false, "a returned thread resumed");
}

std::string Where(const Fiber& f) {
  return "thread (" + std::to_string(f.at.thread.x) + ", " + std::to_string(f.at.thread.y) + ", " +
         std::to_string(f.at.thread.z) + ") of block (" + std::to_string(f.at.block.x) + ", " +
         std::to_string(f.at.block.y) + ", " + std::to_string(f.at.block.z) + ")";
}

// A fiber about to run the kernel as the thread at `at`. (Out of line: the
// loops calling it keep their variables across getcontext.)
[[gnu::noinline]] void Start(Block& b, Fiber& f, const Coordinates& at) {
  f.at = at;
  f.wait = Wait::kNone;
  f.site = 0;
  f.warp_ops = 0;
  f.prologue = false;
#if defined(__x86_64__)
  // What FsEmuSwitch pops: the control words, six registers, then Entry as
  // the return address, its own return slot 16-byte aligned less 8 as
  // after a call.
  auto top = reinterpret_cast<uintptr_t>(f.stack + kStackBytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top - 24);  // Entry's return slot (8 mod 16)
  sp[0] = 0;                                         // Entry never returns
  sp[-1] = reinterpret_cast<uint64_t>(&Entry);
  for (int r = 2; r <= 7; ++r) sp[-r] = 0;  // rbp, rbx, r12 to r15
  uint32_t words[2] = {0, 0};
  asm volatile("stmxcsr %0" : "=m"(words[0]));
  asm volatile("fnstcw %0" : "=m"(words[1]));
  std::memcpy(&sp[-8], words, 8);
  f.context.sp = &sp[-8];
  (void)b;
#else
  getcontext(&f.context.uc);
  f.context.uc.uc_stack.ss_sp = f.stack;
  f.context.uc.uc_stack.ss_size = kStackBytes;
  f.context.uc.uc_link = &b.scheduler.uc;
  makecontext(&f.context.uc, Entry, 0);
#endif
}

// Runs warp w's lanes until none can go on alone: each returned or waiting
// at __syncthreads. A warp operation every lane reached lets them on.
void RunWarp(Block& b, size_t w) {
  const size_t lo = 32 * w, hi = std::min(b.fibers.size(), lo + 32);
  while (true) {
    for (size_t i = lo; i < hi; ++i) {
      Fiber& f = b.fibers[i];
      if (f.wait != Wait::kNone) continue;
      b.current = static_cast<int>(i);
      SwitchTo(&b.scheduler, &f.context);
      b.current = -1;
    }
    size_t at_warp = 0, returned = 0;
    for (size_t i = lo; i < hi; ++i) {
      at_warp += b.fibers[i].wait == Wait::kWarp;
      returned += b.fibers[i].wait == Wait::kDone;
    }
    if (at_warp == 0) return;
    FS_CHECK_MSG(returned == 0,
                 "a warp-wide operation (line {}) that lanes of its warp have returned before: {}",
                 b.fibers[lo].site, Where(b.fibers[lo]));
    for (size_t i = lo; i < hi; ++i) {
      const Fiber& f = b.fibers[i];
      FS_CHECK_MSG(f.wait == Wait::kWarp,
                   "a warp-wide operation (line {}) some lanes of the warp never reach (they wait "
                   "at __syncthreads): {}",
                   b.fibers[lo].site, Where(f));
      FS_CHECK_MSG(f.site == b.fibers[lo].site,
                   "lanes of a warp at different warp-wide operations (lines {} and {}): {}",
                   b.fibers[lo].site, f.site, Where(f));
    }
    for (size_t i = lo; i < hi; ++i) b.fibers[i].wait = Wait::kNone;
  }
}

// Runs a block's fibers to their ends, a warp at a time between its
// __syncthreads.
void RunBlock(Block& b) {
  const size_t n = b.fibers.size(), warps = (n + 31) / 32;
  while (true) {
    for (size_t w = 0; w < warps; ++w) RunWarp(b, w);
    size_t done = 0;
    for (const Fiber& f : b.fibers) done += f.wait == Wait::kDone;
    if (done == n) return;
    // Every thread not returned waits at __syncthreads: all go on.
    for (Fiber& f : b.fibers) {
      if (f.wait == Wait::kBlock) f.wait = Wait::kNone;
    }
  }
}

}  // namespace

const Coordinates& Self() {
  if (!g_block || g_block->current < 0) return g_host;
  return g_block->fibers[static_cast<size_t>(g_block->current)].at;
}

void SyncThreads() { Yield(Wait::kBlock, 0); }

int Lane() {
  Current();  // (checks it is inside a kernel)
  return g_block->current % 32;
}

void WarpGather(int site, const void* mine, size_t bytes, void* all) {
  WarpExchange(site, mine, bytes, -1, all);
}

void WarpExchange(int site, const void* mine, size_t bytes, int from, void* out) {
  FS_CHECK(bytes <= kSlotBytes);
  Fiber& f = Current();
  const size_t warp = static_cast<size_t>(g_block->current) / 32;
  const size_t lane = static_cast<size_t>(Lane());
  // Two sets of slots, taken in turn by a warp's operations: a lane writes
  // the next operation's while others may still read this one's, and
  // none writes this one's again before every lane has passed the next.
  auto& slots = g_block->slots[2 * warp + (f.warp_ops++ & 1)];
  std::memcpy(slots.data() + lane * kSlotBytes, mine, bytes);
  Yield(Wait::kWarp, site);
  if (from >= 0) {
    std::memcpy(out, slots.data() + static_cast<size_t>(from) * kSlotBytes, bytes);
    return;
  }
  for (size_t l = 0; l < 32; ++l) {
    std::memcpy(static_cast<unsigned char*>(out) + l * bytes, slots.data() + l * kSlotBytes, bytes);
  }
}

unsigned char* DynamicShared() {
  FS_CHECK_MSG(g_block, "dynamic shared memory outside a kernel");
  return g_block->shared.data();
}

void Run(const void* kernel, dim3 grid, dim3 block, size_t shared,
         const std::function<void()>& body) {
  FS_CHECK_MSG(!g_block, "a launch from inside a kernel");
  const size_t threads = static_cast<size_t>(block.x) * block.y * block.z;
  FS_CHECK_MSG(threads >= 1 && threads <= 1024, "a block of {} threads", threads);
  FS_CHECK_MSG(grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.y <= 65535 && grid.z <= 65535,
               "a grid of ({}, {}, {}) blocks", grid.x, grid.y, grid.z);
  auto raised = SharedLimits().find(kernel);
  const size_t limit = raised == SharedLimits().end() ? kDefaultShared : raised->second;
  FS_CHECK_MSG(shared <= limit,
               "a launch with {} bytes of dynamic shared memory, over the kernel's limit of {} "
               "(cudaFuncSetAttribute raises it)",
               shared, limit);
  // Stacks kept for the thread's next launches (a launch a kernel, many
  // a step).
  thread_local std::vector<std::unique_ptr<char[]>> stacks;
  while (stacks.size() < threads) stacks.emplace_back(new char[kStackBytes]);
  Block b;
  b.body = &body;
  b.fibers.resize(threads);
  for (size_t i = 0; i < threads; ++i) b.fibers[i].stack = stacks[i].get();
  b.slots.assign(2 * ((threads + 31) / 32), std::vector<unsigned char>(32 * kSlotBytes));
  g_block = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        // Uninitialised shared memory: NaNs, not zeros.
        b.shared.assign(shared, 0xff);
        size_t i = 0;
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx, ++i) {
              Start(b, b.fibers[i], Coordinates{{tx, ty, tz}, {x, y, z}, block, grid});
            }
        RunBlock(b);
        for (const Fiber& f : b.fibers) {
          FS_CHECK_MSG(f.prologue,
                       "a kernel whose thread ({}, {}, {}) of block ({}, {}, {}) did not start "
                       "with FS_KERNEL_PROLOGUE (kernels.h)",
                       f.at.thread.x, f.at.thread.y, f.at.thread.z, x, y, z);
        }
      }
  g_block = nullptr;
}

void KernelPrologue() {
  Fiber& f = Current();
  FS_CHECK_MSG(f.warp_ops == 0 && !f.prologue, "FS_KERNEL_PROLOGUE not a kernel's first statement");
  f.prologue = true;
}

void Mma16816(int site, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
              bool bf16) {
  struct Fragments {
    uint32_t a[4], b[2];
    float c[4];
  };
  Fragments mine{{a[0], a[1], a[2], a[3]}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
  Fragments all[32];
  WarpGather(site, &mine, sizeof(mine), all);
  // Element i (0 or 1) of a register: the lower half first.
  auto half = [bf16](uint32_t r, int i) {
    const uint16_t h = static_cast<uint16_t>(i == 0 ? r & 0xffffu : r >> 16);
    if (bf16) return __bfloat162float(__ushort_as_bfloat16(h));
    return __half2float(__ushort_as_half(h));
  };
  // A (16 x 16): row r, column k; B (16 x 8): row k, column n.
  auto A = [&](int r, int k) {
    const int lane = 4 * (r % 8) + (k % 8) / 2, reg = r / 8 + 2 * (k / 8);
    return half(all[lane].a[reg], k % 2);
  };
  auto B = [&](int k, int n) {
    const int lane = 4 * n + (k % 8) / 2;
    return half(all[lane].b[k / 8], k % 2);
  };
  const int lane = Lane();
  const int g = lane / 4, q = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e / 2), n = 2 * q + e % 2;
    float s = all[lane].c[e];
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
    d[e] = s;
  }
}

void CopyAsync16(void* dst, const void* src, bool valid) {
  if (valid) {
    std::memcpy(dst, src, 16);
  } else {
    std::memset(dst, 0, 16);
  }
}

void LoadMatrixX4(int site, uint32_t (&r)[4], const void* row) {
  const void* rows[32];
  WarpGather(site, &row, sizeof(row), rows);
  const int lane = Lane();
  for (int i = 0; i < 4; ++i) {
    std::memcpy(&r[i], static_cast<const unsigned char*>(rows[8 * i + lane / 4]) + 4 * (lane % 4),
                4);
  }
}

void SortPairsDescending(const float* keys_in, float* keys_out, const int* values_in,
                         int* values_out, int n) {
  // A float's bits as an unsigned number ordered as the floats: negative
  // ones flipped whole, the others their sign bit set; -0 as +0.
  auto order = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
  };
  std::vector<int> index(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) index[static_cast<size_t>(i)] = i;
  std::stable_sort(index.begin(), index.end(),
                   [&](int a, int b) { return order(keys_in[a]) > order(keys_in[b]); });
  std::vector<float> keys(static_cast<size_t>(n));
  std::vector<int> values(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    keys[static_cast<size_t>(i)] = keys_in[index[static_cast<size_t>(i)]];
    values[static_cast<size_t>(i)] = values_in[index[static_cast<size_t>(i)]];
  }
  std::copy(keys.begin(), keys.end(), keys_out);
  std::copy(values.begin(), values.end(), values_out);
}

}  // namespace failsafe::cuda::emu

// The runtime calls of the kernels' launch functions.
extern "C" {

cudaError_t cudaGetLastError() { return cudaSuccess; }

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    FS_CHECK_MSG(value >= 0 && static_cast<size_t>(value) <= failsafe::cuda::emu::kMaxSharedBytes,
                 "a kernel's dynamic shared memory raised to {} bytes, over {}", value,
                 failsafe::cuda::emu::kMaxSharedBytes);
    failsafe::cuda::emu::SharedLimits()[func] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}

const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "an error (CPU emulation)";
}

}  // extern "C"
