// A weight matrix held as a set of items (head groups, FFN shards, vocabulary
// chunks), each a fixed number of rows. Items live in segments of consecutive
// ids with their own storage in a backend's device memory, so a device can
// gain and drop items without copying the items it keeps. Elements are f32,
// bf16 or f16 (the checkpoint's type: 16-bit weights stay 16-bit in device
// memory, and the kernels widen them in registers).
//
// Thread-safety: not thread-safe; owned by the device's compute thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/safetensors.h"

namespace failsafe {

// Bytes of a backend's device memory, freed with this object.
struct DeviceBytes {
  DeviceBytes(DeviceMemory* memory, size_t n);
  ~DeviceBytes();
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  DeviceMemory* const memory;
  unsigned char* data = nullptr;
  const size_t size;
};

// 64-byte aligned float storage in host memory (benchmarks).
struct AlignedFloats {
  explicit AlignedFloats(size_t n);
  ~AlignedFloats();
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data = nullptr;
  size_t size = 0;
  size_t mapped_bytes = 0;  // > 0 when mmapped
};

// How an item's [rows, cols] elements lie in its storage (no padding in any).
enum class ItemLayout {
  kRowMajor,
  // Blocks of 16 rows stored k-major and a last block of the remaining rows
  // (Blocked16Index with the item's rows, which pairs bf16's k-values): what
  // LinearNT reads fastest, no transposing or packing per call.
  kBlocked,
  // The item's transpose [cols, rows] blocked the same way: a [k, n] item of
  // LinearNNFixed (rows its k-values) in blocks of 16 output columns.
  kColumnBlocked,
  // The item's transpose [cols, rows], row-major: a [k, n] item of
  // LinearNNFixed as the [n, k] weight of a product by its transpose.
  kTransposed,
};

class ItemMatrix {
 public:
  struct Segment {
    std::shared_ptr<DeviceBytes> storage;
    unsigned char* data = nullptr;  // device memory: rows of item `first`, elements of the dtype
    int first = 0;                  // items [first, first + count)
    int count = 0;
  };

  ItemMatrix() = default;
  // Items in `memory` (a backend's; HostMemory() where none is given).
  ItemMatrix(int rows_per_item, int cols, DType dtype = DType::kF32,
             ItemLayout layout = ItemLayout::kRowMajor, DeviceMemory* memory = &HostMemory())
      : memory_(memory),
        rows_per_item_(rows_per_item),
        cols_(cols),
        dtype_(dtype),
        layout_(layout) {}

  int rows_per_item() const { return rows_per_item_; }
  int cols() const { return cols_; }
  DType dtype() const { return dtype_; }
  ItemLayout layout() const { return layout_; }
  int64_t item_elements() const { return static_cast<int64_t>(rows_per_item_) * cols_; }
  int64_t item_bytes() const { return item_elements() * static_cast<int64_t>(DTypeSize(dtype_)); }
  // A segment's rows as the kernels take them.
  WeightsRef Weights(const Segment& s) const {
    const bool blocked = layout_ == ItemLayout::kBlocked || layout_ == ItemLayout::kColumnBlocked;
    return {s.data, dtype_, blocked, layout_ == ItemLayout::kBlocked ? rows_per_item_ : 0,
            layout_ == ItemLayout::kTransposed};
  }
  // Segments ascending by item id.
  const std::vector<Segment>& segments() const { return segments_; }
  int num_items() const;
  std::vector<int> items() const;
  bool Has(int item) const { return Find(item) != nullptr; }
  // The item's rows in device memory (elements of dtype()), or nullptr.
  const unsigned char* Find(int item) const;
  // Rows [row, row + rows) of a held item, as f32 (exact), into host dst
  // [rows, cols] (copied from device memory).
  void ReadRows(int item, int row, int rows, float* dst) const;
  int64_t bytes() const { return static_cast<int64_t>(num_items()) * item_bytes(); }

  // Items go to device memory that is not host memory in runs of up to
  // this many bytes (one item at least), staged on the host.
  static constexpr int64_t kStagingBytes = int64_t{64} << 20;
  // Adds items [first, first + count) (none may be held) in one new segment;
  // fill(item, dst) writes each item's rows as f32, stored as dtype()
  // (rounded to nearest even: exact for values read from a file of that
  // type). `fill_is_thread_safe`: items may be filled on several threads at
  // once (into device memory that is not host memory).
  void Add(int first, int count, const std::function<void(int item, float* dst)>& fill,
           bool fill_is_thread_safe = false);
  // An item's bytes as the matrix holds them, copied from the source without
  // conversion: for kRowMajor its rows, for kTransposed its transpose's
  // rows (an item of a [k, n] product held as the [n, k] weight: a run of
  // columns of each of the source's rows). copy(item, dst) returns false
  // where the source is not of dtype(); fill then writes that item whole.
  // Used only when `layout` is the matrix's.
  struct RawSource {
    ItemLayout layout = ItemLayout::kRowMajor;
    std::function<bool(int item, unsigned char* dst)> copy;
  };
  // Add, each item copied by `raw` where it can be: the same bytes (a value
  // read as f32 and rounded back is itself), without the round trip or, for
  // kTransposed, transposing twice.
  void Add(int first, int count, const std::function<void(int item, float* dst)>& fill,
           bool fill_is_thread_safe, const RawSource& raw);
  // Adds a segment that shares storage with another matrix (no copy).
  void AddShared(const Segment& segment);
  // Takes the item out (no copy: a segment may split in two) and returns a
  // one-item segment sharing its storage.
  Segment Remove(int item);
  void Clear() { segments_.clear(); }

 private:
  void Insert(const Segment& s);
  // An item's f32 rows into its storage: dtype() and layout().
  void LayOut(const float* item, unsigned char* dst) const;
  DeviceMemory* memory_ = &HostMemory();
  int rows_per_item_ = 0;
  int cols_ = 0;
  DType dtype_ = DType::kF32;
  ItemLayout layout_ = ItemLayout::kRowMajor;
  std::vector<Segment> segments_;
};

}  // namespace failsafe
