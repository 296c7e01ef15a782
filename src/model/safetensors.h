// Safetensors files: header parsing, memory-mapped reading and writing.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor name to {dtype, shape, data_offsets: [begin, end)} relative to the
// byte after the header, then the data. Every offset, size and dtype is checked
// against the file before a tensor is handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/file_util.h"

namespace failsafe {

enum class DType { kF32, kF16, kBF16 };
const char* DTypeName(DType d);
size_t DTypeSize(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offset in the data section
  uint64_t end = 0;
  int64_t numel() const;
};

// Parses and validates the header of a safetensors file held in memory.
// `data`/`size` is the whole file. Pure function (the fuzz target).
Result<std::vector<TensorInfo>> ParseSafetensorsHeader(const unsigned char* data, size_t size,
                                                       const std::string& source);

// A read-only view of one tensor inside a mapped file.
struct TensorRef {
  const TensorInfo* info = nullptr;
  const unsigned char* data = nullptr;  // first byte of the tensor
  const std::string* file = nullptr;    // path of the file holding it

  // A 1-D tensor is one row; an N-D tensor has shape[0] rows.
  int64_t rows() const { return info->shape.size() <= 1 ? 1 : info->shape[0]; }
  int64_t cols() const;  // elements per row
  // Copies rows [row_begin, row_begin + num_rows) as fp32 into dst [num_rows, cols()].
  void ReadRows(int64_t row_begin, int64_t num_rows, float* dst) const;
  // Copies columns [col_begin, col_begin + num_cols) of a 2-D tensor, transposed,
  // into dst [num_cols, rows()]: dst[c][r] = tensor[r][col_begin + c].
  void ReadColsTransposed(int64_t col_begin, int64_t num_cols, float* dst) const;
  // The same elements as they are stored, where the tensor's type is `want`
  // (false, writing nothing, where it is not): rows [row_begin, row_begin +
  // num_rows) into dst [num_rows, cols()]; and columns [col_begin, col_begin
  // + num_cols) of every row, untransposed, into dst [rows(), num_cols].
  bool CopyRows(int64_t row_begin, int64_t num_rows, DType want, void* dst) const;
  bool CopyCols(int64_t col_begin, int64_t num_cols, DType want, void* dst) const;
};

// One memory-mapped safetensors file.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(const std::string& name) const;
  TensorRef Ref(const TensorInfo* info) const;
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  size_t data_start_ = 0;
};

// Writes a safetensors file from fp32 tensors produced on demand, so that
// multi-GB models never sit in memory whole.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype = DType::kF32;
  };
  // fill(entry_index, dst) must write numel fp32 values into dst.
  using FillFn = void (*)(void* ctx, size_t entry_index, float* dst);

  static Status Write(const std::string& path, const std::vector<Entry>& entries, FillFn fill,
                      void* ctx);
};

// fp16 / bf16 conversions.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
uint16_t FloatToBFloat16(float f);  // round to nearest even

}  // namespace failsafe
