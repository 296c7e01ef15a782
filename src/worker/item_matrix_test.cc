// Item matrices held blocked whatever their rows per item: the elements read
// back exactly, items move between matrices as their bytes, and LinearNT on
// a segment gives bit for bit what the row-major copy of the same values
// gives (one chain of fused multiply-adds per output element).
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

TEST(ItemMatrix, BlockedItemsOfAnyRowsReadBackAndMultiplyAsRowMajor) {
  auto backend = MakeCpuBackend(2);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int rows : {16, 44, 88, 5, 500}) {
      const int cols = 70, count = 3, m = 2;
      ItemMatrix blocked(rows, cols, t, /*blocked=*/true), plain(rows, cols, t);
      auto fill = [&](int item, float* dst) { Fill(item, rows, cols, dst); };
      blocked.Add(4, count, fill);
      plain.Add(4, count, fill);
      ASSERT_TRUE(blocked.blocked());
      EXPECT_EQ(blocked.item_bytes(), plain.item_bytes());  // no padding
      // Every row reads back as the row-major copy's.
      std::vector<float> a(static_cast<size_t>(rows) * cols), b(a.size());
      for (int item = 4; item < 4 + count; ++item) {
        blocked.ReadRows(item, 0, rows, a.data());
        plain.ReadRows(item, 0, rows, b.data());
        ASSERT_EQ(Bits(a), Bits(b)) << "rows " << rows << " item " << item;
      }
      // One item moves out (its bytes, no copy) and the rest still multiply
      // as the row-major copy does, segment by segment.
      ItemMatrix moved(rows, cols, t, true);
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
      moved.ReadRows(5, 0, rows, a.data());
      ItemMatrix check(rows, cols, t);
      check.Add(5, 1, fill);
      check.ReadRows(5, 0, rows, b.data());
      EXPECT_EQ(Bits(a), Bits(b));
    }
  }
}

}  // namespace
}  // namespace failsafe
