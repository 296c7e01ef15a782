// A weight matrix held as a set of items (head groups, FFN shards, vocabulary
// chunks), each a fixed number of rows. Items live in segments of consecutive
// ids with their own storage, so a device can gain and drop items without
// copying the items it keeps.
//
// Thread-safety: not thread-safe; owned by the device's compute thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace failsafe {

// 64-byte aligned float storage.
struct AlignedFloats {
  explicit AlignedFloats(size_t n);
  ~AlignedFloats();
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data = nullptr;
  size_t size = 0;
  size_t mapped_bytes = 0;  // > 0 when mmapped
};

class ItemMatrix {
 public:
  struct Segment {
    std::shared_ptr<AlignedFloats> storage;
    float* data = nullptr;  // rows of item `first`
    int first = 0;          // items [first, first + count)
    int count = 0;
  };

  ItemMatrix() = default;
  ItemMatrix(int rows_per_item, int cols) : rows_per_item_(rows_per_item), cols_(cols) {}

  int rows_per_item() const { return rows_per_item_; }
  int cols() const { return cols_; }
  int64_t item_floats() const { return static_cast<int64_t>(rows_per_item_) * cols_; }
  // Segments ascending by item id.
  const std::vector<Segment>& segments() const { return segments_; }
  int num_items() const;
  std::vector<int> items() const;
  bool Has(int item) const { return Find(item) != nullptr; }
  // The item's rows, or nullptr.
  const float* Find(int item) const;
  int64_t bytes() const { return static_cast<int64_t>(num_items()) * item_floats() * 4; }

  // Adds items [first, first + count) (none may be held) in one new segment;
  // fill(item, dst) writes each item's rows.
  void Add(int first, int count, const std::function<void(int item, float* dst)>& fill);
  // Adds a segment that shares storage with another matrix (no copy).
  void AddShared(const Segment& segment);
  // Takes the item out (no copy: a segment may split in two) and returns a
  // one-item segment sharing its storage.
  Segment Remove(int item);
  void Clear() { segments_.clear(); }

 private:
  void Insert(const Segment& s);
  int rows_per_item_ = 0;
  int cols_ = 0;
  std::vector<Segment> segments_;
};

}  // namespace failsafe
