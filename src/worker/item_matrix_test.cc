// Item matrices held blocked (or column-blocked) whatever their rows per
// item: the elements read back exactly, items move between matrices as their
// bytes, and LinearNT (LinearNNFixed) on a segment gives bit for bit what the
// row-major copy of the same values gives (one chain of fused multiply-adds
// per output element).
#include "worker/item_matrix.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

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

}  // namespace
}  // namespace failsafe
