#include "worker/item_matrix.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/check.h"

namespace failsafe {

namespace {
constexpr size_t kHugePage = 2u << 20;
}

DeviceBytes::DeviceBytes(DeviceMemory* m, size_t n)
    : memory(m), data(static_cast<unsigned char*>(m->Allocate(n))), size(n) {}

DeviceBytes::~DeviceBytes() { memory->Free(data, size); }

// Large weight buffers are mapped with transparent huge pages: decode streams
// every weight byte each step, and 4 KiB pages would cost TLB misses.
AlignedFloats::AlignedFloats(size_t n) : size(n) {
  size_t bytes = (std::max<size_t>(n, 1) * sizeof(float) + 63) / 64 * 64;
  if (bytes >= kHugePage) {
    mapped_bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p =
        ::mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, mapped_bytes, MADV_HUGEPAGE);
    data = static_cast<float*>(p);
    return;
  }
  data = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!data) throw std::bad_alloc();
}

AlignedFloats::~AlignedFloats() {
  if (mapped_bytes) {
    ::munmap(data, mapped_bytes);
  } else {
    std::free(data);
  }
}

int ItemMatrix::num_items() const {
  int n = 0;
  for (auto& s : segments_) n += s.count;
  return n;
}

std::vector<int> ItemMatrix::items() const {
  std::vector<int> out;
  for (auto& s : segments_) {
    for (int i = 0; i < s.count; ++i) out.push_back(s.first + i);
  }
  return out;
}

const unsigned char* ItemMatrix::Find(int item) const {
  for (auto& s : segments_) {
    if (item >= s.first && item < s.first + s.count)
      return s.data + (item - s.first) * item_bytes();
  }
  return nullptr;
}

namespace {

float ElementAt(const unsigned char* base, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return HalfToFloat(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::kF32:
      break;
  }
  return reinterpret_cast<const float*>(base)[i];
}

// Index of element (r, c) of an item [rows, cols] in its storage.
int64_t StorageIndex(ItemLayout layout, int64_t r, int64_t c, int64_t rows, int64_t cols, DType t) {
  switch (layout) {
    case ItemLayout::kBlocked:
      return Blocked16Index(r, c, rows, cols, t);
    case ItemLayout::kColumnBlocked:
      return Blocked16Index(c, r, cols, rows, t);
    case ItemLayout::kTransposed:
      return c * rows + r;
    case ItemLayout::kRowMajor:
      break;
  }
  return r * cols + c;
}

}  // namespace

void ItemMatrix::ReadRows(int item, int row, int rows, float* dst) const {
  const unsigned char* held = Find(item);
  FS_CHECK_MSG(held != nullptr, "item {} is not held", item);
  std::vector<unsigned char> copy;
  const unsigned char* base = held;
  if (!memory_->host_memory()) {  // the whole item to the host
    copy.resize(static_cast<size_t>(item_bytes()));
    memory_->CopyToHost(copy.data(), held, copy.size());
    base = copy.data();
  }
  if (layout_ != ItemLayout::kRowMajor) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols_; ++c)
        dst[static_cast<int64_t>(r) * cols_ + c] = ElementAt(
            base, dtype_, StorageIndex(layout_, row + r, c, rows_per_item_, cols_, dtype_));
    }
    return;
  }
  const int64_t begin = static_cast<int64_t>(row) * cols_, n = static_cast<int64_t>(rows) * cols_;
  switch (dtype_) {
    case DType::kF32:
      std::memcpy(dst, reinterpret_cast<const float*>(base) + begin, sizeof(float) * n);
      return;
    case DType::kBF16: {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(base) + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(src[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(base) + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
      return;
    }
  }
}

void ItemMatrix::Insert(const Segment& seg) {
  for (int i = 0; i < seg.count; ++i)
    FS_CHECK_MSG(!Has(seg.first + i), "item {} already held", seg.first + i);
  auto it = std::lower_bound(segments_.begin(), segments_.end(), seg.first,
                             [](const Segment& s, int first) { return s.first < first; });
  segments_.insert(it, seg);
}

void ItemMatrix::LayOut(const float* item, unsigned char* dst) const {
  const int64_t n = item_elements();
  if (layout_ == ItemLayout::kRowMajor) {
    switch (dtype_) {
      case DType::kF32:
        std::memcpy(dst, item, static_cast<size_t>(n) * 4);
        return;
      case DType::kBF16:
        for (int64_t i = 0; i < n; ++i)
          reinterpret_cast<uint16_t*>(dst)[i] = FloatToBFloat16(item[i]);
        return;
      case DType::kF16:
        for (int64_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(dst)[i] = FloatToHalf(item[i]);
        return;
    }
  }
  for (int r = 0; r < rows_per_item_; ++r) {
    for (int c = 0; c < cols_; ++c) {
      const float v = item[static_cast<size_t>(r) * cols_ + c];
      const int64_t at = StorageIndex(layout_, r, c, rows_per_item_, cols_, dtype_);
      switch (dtype_) {
        case DType::kF32:
          reinterpret_cast<float*>(dst)[at] = v;
          break;
        case DType::kBF16:
          reinterpret_cast<uint16_t*>(dst)[at] = FloatToBFloat16(v);
          break;
        case DType::kF16:
          reinterpret_cast<uint16_t*>(dst)[at] = FloatToHalf(v);
          break;
      }
    }
  }
}

void ItemMatrix::Add(int first, int count, const std::function<void(int, float*)>& fill,
                     bool fill_is_thread_safe) {
  Add(first, count, fill, fill_is_thread_safe, RawSource{});
}

void ItemMatrix::Add(int first, int count, const std::function<void(int, float*)>& fill,
                     bool fill_is_thread_safe, const RawSource& raw) {
  if (count <= 0) return;
  const bool copies = raw.copy && raw.layout == layout_ &&
                      (layout_ == ItemLayout::kRowMajor || layout_ == ItemLayout::kTransposed);
  // One item into dst as held: copied where the source allows, else
  // through f32 (`item`, the caller's scratch).
  auto place = [&](int id, std::vector<float>& item, unsigned char* dst) {
    if (copies && raw.copy(id, dst)) return;
    item.resize(static_cast<size_t>(item_elements()));
    fill(id, item.data());
    LayOut(item.data(), dst);
  };
  Segment seg;
  const int64_t bytes = count * item_bytes();
  seg.storage = std::make_shared<DeviceBytes>(memory_, static_cast<size_t>(bytes));
  seg.data = seg.storage->data;
  seg.first = first;
  seg.count = count;
  if (memory_->host_memory()) {
    if (dtype_ == DType::kF32 && layout_ == ItemLayout::kRowMajor && !copies) {
      for (int i = 0; i < count; ++i)
        fill(first + i, reinterpret_cast<float*>(seg.data + i * item_bytes()));
    } else {
      // Copied, or through one item of f32, rounded to the element type and
      // laid out.
      std::vector<float> item;
      for (int i = 0; i < count; ++i) place(first + i, item, seg.data + i * item_bytes());
    }
    Insert(seg);
    return;
  }
  // Device memory: items laid out on the host (on all the host's threads
  // where the fill allows: a GPU's host is otherwise idle while it loads)
  // and copied in runs of up to kStagingBytes: through the device's two
  // page-locked staging buffers where it has them (DeviceMemory::Staging:
  // one run laid out while the one before it is copied), else through a
  // buffer this thread keeps, whose pages are touched once per thread, not
  // once per segment (a layer's gate/up is 235 MB on the 8B shape), and
  // which the copy may reuse on return (DeviceMemory::CopyToDevice).
  thread_local std::vector<unsigned char> staging;
  const int64_t ib = item_bytes();
  const int per_run = static_cast<int>(std::max<int64_t>(1, kStagingBytes / ib));
  int which = 0;
  for (int i0 = 0; i0 < count; i0 += per_run) {
    const int n = std::min(per_run, count - i0);
    const size_t run_bytes = static_cast<size_t>(n * ib);
    auto* buf = static_cast<unsigned char*>(memory_->Staging(which, run_bytes));
    const bool staged = buf != nullptr;
    if (!staged) {
      if (staging.size() < run_bytes) staging.resize(run_bytes);
      buf = staging.data();
    }
#pragma omp parallel for schedule(dynamic) if (fill_is_thread_safe && n > 1)
    for (int i = 0; i < n; ++i) {
      std::vector<float> item;
      place(first + i0 + i, item, buf + i * ib);
    }
    if (staged) {
      memory_->CopyFromStaging(which, seg.data + i0 * ib, run_bytes);
      which ^= 1;
    } else {
      memory_->CopyToDevice(seg.data + i0 * ib, buf, run_bytes);
    }
  }
  Insert(seg);
}

void ItemMatrix::AddShared(const Segment& segment) {
  if (segment.count > 0) Insert(segment);
}

ItemMatrix::Segment ItemMatrix::Remove(int item) {
  for (size_t k = 0; k < segments_.size(); ++k) {
    Segment s = segments_[k];
    if (item < s.first || item >= s.first + s.count) continue;
    Segment taken{s.storage, s.data + (item - s.first) * item_bytes(), item, 1};
    Segment left{s.storage, s.data, s.first, item - s.first};
    Segment right{s.storage, taken.data + item_bytes(), item + 1, s.first + s.count - item - 1};
    segments_.erase(segments_.begin() + static_cast<long>(k));
    if (left.count > 0) Insert(left);
    if (right.count > 0) Insert(right);
    return taken;
  }
  FS_CHECK_MSG(false, "item {} is not held", item);
  return {};
}

}  // namespace failsafe
