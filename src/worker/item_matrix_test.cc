// Item matrices held blocked (or column-blocked) whatever their rows per
// item: the elements read back exactly, items move between matrices as their
// bytes, and LinearNT (LinearNNFixed) on a segment gives bit for bit what the
// row-major copy of the same values gives (one chain of fused multiply-adds
// per output element).
#include "worker/item_matrix.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/staged_memory.h"
#include "common/rng.h"

namespace failsafe {
namespace {

// Item i's rows [rows, cols]: values distinct per (item, row, column).
void Fill(int item, int rows, int cols, float* dst) {
  Rng r(1000 + static_cast<uint64_t>(item));
  for (int i = 0; i < rows * cols; ++i) dst[i] = static_cast<float>(r.Normal());
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), sizeof(float) * v.size());
  return out;
}

// Items [first, first + count) of m read back, whole and one row from
// inside, as the row-major `plain` holds them.
void ExpectReadsAs(const ItemMatrix& m, const ItemMatrix& plain, int first, int count) {
  const int rows = m.rows_per_item(), cols = m.cols();
  std::vector<float> a(static_cast<size_t>(rows) * cols), b(a.size());
  for (int item = first; item < first + count; ++item) {
    m.ReadRows(item, 0, rows, a.data());
    plain.ReadRows(item, 0, rows, b.data());
    ASSERT_EQ(Bits(a), Bits(b)) << "rows " << rows << " item " << item;
    a.assign(a.size(), 0.0f);
    b.assign(b.size(), 0.0f);
    m.ReadRows(item, rows / 2, 1, a.data());
    plain.ReadRows(item, rows / 2, 1, b.data());
    ASSERT_EQ(Bits(a), Bits(b)) << "rows " << rows << " item " << item << " row " << rows / 2;
  }
}

TEST(ItemMatrix, BlockedItemsOfAnyRowsReadBackAndMultiplyAsRowMajor) {
  auto backend = MakeCpuBackend(2);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int rows : {16, 44, 88, 5, 500}) {
      const int cols = 70, count = 3, m = 2;
      ItemMatrix blocked(rows, cols, t, ItemLayout::kBlocked), plain(rows, cols, t);
      auto fill = [&](int item, float* dst) { Fill(item, rows, cols, dst); };
      blocked.Add(4, count, fill);
      plain.Add(4, count, fill);
      ASSERT_EQ(blocked.layout(), ItemLayout::kBlocked);
      EXPECT_EQ(blocked.item_bytes(), plain.item_bytes());  // no padding
      // Every row reads back as the row-major copy's.
      ExpectReadsAs(blocked, plain, 4, count);
      // One item moves out (its bytes, no copy) and the rest still multiply
      // as the row-major copy does, segment by segment.
      ItemMatrix moved(rows, cols, t, ItemLayout::kBlocked);
      moved.AddShared(blocked.Remove(5));
      plain.Remove(5);
      std::vector<float> x(static_cast<size_t>(m) * cols);
      Rng r(7);
      for (auto& v : x) v = static_cast<float>(r.Normal());
      ASSERT_EQ(blocked.segments().size(), plain.segments().size());
      for (size_t s = 0; s < blocked.segments().size(); ++s) {
        const int n = blocked.segments()[s].count * rows;
        std::vector<float> y1(static_cast<size_t>(m) * n), y2(y1.size());
        for (int mm : {1, m}) {
          backend->LinearNT(x.data(), cols, blocked.Weights(blocked.segments()[s]), y1.data(), n,
                            mm, n, cols, false);
          backend->LinearNT(x.data(), cols, plain.Weights(plain.segments()[s]), y2.data(), n, mm, n,
                            cols, false);
          EXPECT_EQ(Bits(y1), Bits(y2)) << "rows " << rows << " segment " << s << " m " << mm;
        }
      }
      ItemMatrix check(rows, cols, t);
      check.Add(5, 1, fill);
      ExpectReadsAs(moved, check, 5, 1);
    }
  }
}

// The o and down projections' items ([item_k, n], LinearNNFixed's k-values
// as rows) held column-blocked: read back, moved, and multiplied in fixed
// point as the row-major copy is, with few rows and many.
TEST(ItemMatrix, ColumnBlockedItemsReadBackAndMultiplyAsRowMajor) {
  auto backend = MakeCpuBackend(2);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int rows : {64, 44, 7}) {
      const int cols = 200, count = 4;
      ItemMatrix blocked(rows, cols, t, ItemLayout::kColumnBlocked), plain(rows, cols, t);
      auto fill = [&](int item, float* dst) { Fill(item, rows, cols, dst); };
      blocked.Add(2, count, fill);
      plain.Add(2, count, fill);
      EXPECT_EQ(blocked.item_bytes(), plain.item_bytes());  // no padding
      ExpectReadsAs(blocked, plain, 2, count);
      ItemMatrix moved(rows, cols, t, ItemLayout::kColumnBlocked);
      moved.AddShared(blocked.Remove(3));
      plain.Remove(3);
      ASSERT_EQ(blocked.segments().size(), plain.segments().size());
      const int ldx = count * rows;
      std::vector<float> x(static_cast<size_t>(40) * ldx);
      Rng r(9);
      for (auto& v : x) v = static_cast<float>(r.Normal());
      for (int m : {1, 3, 8, 40}) {
        std::vector<int64_t> acc1(static_cast<size_t>(m) * cols, 5), acc2(acc1);
        int k0 = 0;
        for (size_t s = 0; s < blocked.segments().size(); ++s) {
          const int k = blocked.segments()[s].count * rows;
          backend->LinearNNFixed(x.data() + k0, ldx, blocked.Weights(blocked.segments()[s]),
                                 acc1.data(), cols, m, cols, k, rows);
          backend->LinearNNFixed(x.data() + k0, ldx, plain.Weights(plain.segments()[s]),
                                 acc2.data(), cols, m, cols, k, rows);
          k0 += k;
        }
        EXPECT_EQ(acc1, acc2) << "type " << static_cast<int>(t) << " rows " << rows << " m " << m;
      }
      ItemMatrix check(rows, cols, t);
      check.Add(3, 1, fill);
      ExpectReadsAs(moved, check, 3, 1);
    }
  }
}

// Items copied as a checkpoint stores them (RawSource) hold the bytes that
// reading them as f32 and laying them out gives: rows for a row-major
// matrix, each source row's run of the item's columns for a transposed one;
// an item the copy refuses goes through f32; a copy of another layout is
// not used.
TEST(ItemMatrix, CopiedItemsHoldWhatTheRoundTripHolds) {
  const int rows = 5, cols = 12, items = 4;  // transposed: items of `rows` columns
  for (DType dt : {DType::kBF16, DType::kF16}) {
    // The source as stored: [items * rows, cols] for row items, and its
    // [cols, items * rows] transpose for column items.
    std::vector<uint16_t> by_rows(static_cast<size_t>(items) * rows * cols),
        by_cols(by_rows.size());
    Rng r(7);
    for (size_t i = 0; i < by_rows.size(); ++i) {
      const float v = static_cast<float>(r.Normal());
      by_rows[i] = dt == DType::kBF16 ? FloatToBFloat16(v) : FloatToHalf(v);
    }
    const int width = items * rows;
    for (int i = 0; i < width; ++i)
      for (int c = 0; c < cols; ++c)
        by_cols[static_cast<size_t>(c) * width + i] = by_rows[static_cast<size_t>(i) * cols + c];
    auto widen = [&](uint16_t h) {
      return dt == DType::kBF16 ? BFloat16ToFloat(h) : HalfToFloat(h);
    };
    // Item `it` as f32 rows [rows, cols]: rows of by_rows, or (the same
    // values) columns of by_cols transposed.
    auto fill = [&](int it, float* dst) {
      for (int i = 0; i < rows * cols; ++i)
        dst[i] = widen(by_rows[static_cast<size_t>(it) * rows * cols + i]);
    };
    int refused = 0;
    auto copy_rows = [&](int it, unsigned char* dst) {
      if (it == 2) return ++refused, false;
      std::memcpy(dst, by_rows.data() + static_cast<size_t>(it) * rows * cols,
                  sizeof(uint16_t) * rows * cols);
      return true;
    };
    auto copy_cols = [&](int it, unsigned char* dst) {
      if (it == 2) return ++refused, false;
      for (int c = 0; c < cols; ++c)
        std::memcpy(dst + sizeof(uint16_t) * c * rows,
                    by_cols.data() + static_cast<size_t>(c) * width + it * rows,
                    sizeof(uint16_t) * rows);
      return true;
    };
    StagedMemory staged;
    for (DeviceMemory* mem :
         {static_cast<DeviceMemory*>(&HostMemory()), static_cast<DeviceMemory*>(&staged)}) {
      for (ItemLayout layout : {ItemLayout::kRowMajor, ItemLayout::kTransposed}) {
        const bool row_major = layout == ItemLayout::kRowMajor;
        ItemMatrix through(rows, cols, dt, layout, mem), copied(rows, cols, dt, layout, mem),
            other(rows, cols, dt, layout, mem);
        through.Add(0, items, fill, true);
        refused = 0;
        copied.Add(0, items, fill, true,
                   {layout, row_major ? std::function<bool(int, unsigned char*)>(copy_rows)
                                      : std::function<bool(int, unsigned char*)>(copy_cols)});
        EXPECT_EQ(refused, 1);
        // A copy for the other layout would give other bytes: not taken.
        other.Add(0, items, fill, true,
                  {row_major ? ItemLayout::kTransposed : ItemLayout::kRowMajor,
                   [&](int, unsigned char*) -> bool {
                     ADD_FAILURE() << "copied";
                     return false;
                   }});
        const size_t bytes = static_cast<size_t>(through.item_bytes()) * items;
        ASSERT_EQ(through.segments().size(), 1u);
        std::vector<unsigned char> a(bytes), b(bytes), c(bytes);
        mem->CopyToHost(a.data(), through.segments()[0].data, bytes);
        mem->CopyToHost(b.data(), copied.segments()[0].data, bytes);
        mem->CopyToHost(c.data(), other.segments()[0].data, bytes);
        EXPECT_EQ(a, b) << DTypeName(dt) << (row_major ? " row-major" : " transposed")
                        << (mem->host_memory() ? " host" : " staged");
        EXPECT_EQ(a, c);
      }
    }
  }
}

}  // namespace
}  // namespace failsafe
