#include "model/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/check.h"

namespace failsafe {

using nlohmann::json;

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

size_t DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool ParseDType(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "F16")
    *out = DType::kF16;
  else if (s == "BF16")
    *out = DType::kBF16;
  else
    return false;
  return true;
}

}  // namespace

Result<std::vector<TensorInfo>> ParseSafetensorsHeader(const unsigned char* data, size_t size,
                                                       const std::string& source) {
  if (size < 8)
    return InvalidArgument("{}: truncated file ({} bytes, no header length)", source, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeaderBytes) return InvalidArgument("{}: header length {} is implausible", source, n);
  if (8 + n > size) {
    return InvalidArgument("{}: truncated file: header needs {} bytes, file has {}", source, 8 + n,
                           size);
  }
  const uint64_t data_size = size - 8 - n;
  json j = json::parse(data + 8, data + 8 + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("{}: header is not a JSON object", source);
  }
  std::vector<TensorInfo> out;
  out.reserve(j.size());
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") continue;
    if (!v.is_object())
      return InvalidArgument("{}: tensor '{}': entry is not an object", source, name);
    TensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) {
      return InvalidArgument("{}: tensor '{}': field 'dtype' is missing", source, name);
    }
    if (!ParseDType(dt->get<std::string>(), &t.dtype)) {
      return InvalidArgument(
          "{}: tensor '{}': field 'dtype': unsupported dtype '{}' (supported: F32, F16, BF16)",
          source, name, dt->get<std::string>());
    }
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array() || sh->size() > 8) {
      return InvalidArgument("{}: tensor '{}': field 'shape' is missing or malformed", source,
                             name);
    }
    uint64_t numel = 1;
    for (auto& d : *sh) {
      if (!d.is_number_unsigned()) {
        return InvalidArgument("{}: tensor '{}': field 'shape' has a non-integer dimension", source,
                               name);
      }
      uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || (dim != 0 && numel > (1ull << 50) / dim)) {
        return InvalidArgument("{}: tensor '{}': field 'shape' is too large", source, name);
      }
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return InvalidArgument("{}: tensor '{}': field 'data_offsets' is missing or malformed",
                             source, name);
    }
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size) {
      return InvalidArgument(
          "{}: tensor '{}': field 'data_offsets' [{}, {}) lies outside the {}-byte data section",
          source, name, t.begin, t.end, data_size);
    }
    if (t.end - t.begin != numel * DTypeSize(t.dtype)) {
      return InvalidArgument(
          "{}: tensor '{}': field 'data_offsets' spans {} bytes but shape and dtype need {}",
          source, name, t.end - t.begin, numel * DTypeSize(t.dtype));
    }
    out.push_back(std::move(t));
  }
  // Overlapping tensors mean the header lies about its offsets.
  std::vector<const TensorInfo*> sorted;
  for (auto& t : out) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->begin < sorted[i - 1]->end) {
      return InvalidArgument("{}: tensor '{}': field 'data_offsets' overlaps tensor '{}'", source,
                             sorted[i]->name, sorted[i - 1]->name);
    }
  }
  return out;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  FS_ASSIGN_OR_RETURN(f->file_, MappedFile::Open(path));
  FS_ASSIGN_OR_RETURN(f->tensors_, ParseSafetensorsHeader(f->file_.data(), f->file_.size(), path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f->file_.data()[i];
  f->data_start_ = 8 + n;
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->by_name_[f->tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

TensorRef SafetensorsFile::Ref(const TensorInfo* info) const {
  return TensorRef{info, file_.data() + data_start_ + info->begin, &file_.path()};
}

int64_t TensorRef::cols() const { return info->numel() / std::max<int64_t>(1, rows()); }

namespace {

inline void Convert(DType dtype, const unsigned char* src, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = HalfToFloat(h);
      }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = BFloat16ToFloat(h);
      }
      break;
  }
}

}  // namespace

void TensorRef::ReadRows(int64_t row_begin, int64_t num_rows, float* dst) const {
  const int64_t c = cols();
  FS_CHECK(row_begin >= 0 && row_begin + num_rows <= rows());
  const size_t es = DTypeSize(info->dtype);
  Convert(info->dtype, data + row_begin * c * es, num_rows * c, dst);
}

void TensorRef::ReadColsTransposed(int64_t col_begin, int64_t num_cols, float* dst) const {
  const int64_t r = rows(), c = cols();
  FS_CHECK(col_begin >= 0 && col_begin + num_cols <= c);
  const size_t es = DTypeSize(info->dtype);
  std::vector<float> row(static_cast<size_t>(num_cols));
  for (int64_t i = 0; i < r; ++i) {
    Convert(info->dtype, data + (i * c + col_begin) * es, num_cols, row.data());
    for (int64_t j = 0; j < num_cols; ++j) dst[j * r + i] = row[j];
  }
}

bool TensorRef::CopyRows(int64_t row_begin, int64_t num_rows, DType want, void* dst) const {
  if (info->dtype != want) return false;
  const int64_t c = cols();
  FS_CHECK(row_begin >= 0 && row_begin + num_rows <= rows());
  const size_t es = DTypeSize(want);
  std::memcpy(dst, data + row_begin * c * es, static_cast<size_t>(num_rows * c) * es);
  return true;
}

bool TensorRef::CopyCols(int64_t col_begin, int64_t num_cols, DType want, void* dst) const {
  if (info->dtype != want) return false;
  const int64_t r = rows(), c = cols();
  FS_CHECK(col_begin >= 0 && col_begin + num_cols <= c);
  const size_t es = DTypeSize(want), run = static_cast<size_t>(num_cols) * es;
  for (int64_t i = 0; i < r; ++i)
    std::memcpy(static_cast<unsigned char*>(dst) + i * run, data + (i * c + col_begin) * es, run);
  return true;
}

Status SafetensorsWriter::Write(const std::string& path, const std::vector<Entry>& entries,
                                FillFn fill, void* ctx) {
  json header = json::object();
  uint64_t offset = 0;
  for (auto& e : entries) {
    uint64_t numel = 1;
    for (auto d : e.shape) numel *= static_cast<uint64_t>(d);
    uint64_t bytes = numel * DTypeSize(e.dtype);
    header[e.name] = {{"dtype", DTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return Internal("{}: cannot create: {}", tmp, std::strerror(errno));
  unsigned char len[8];
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  std::vector<float> buf;
  std::vector<uint16_t> half;
  for (size_t i = 0; i < entries.size(); ++i) {
    uint64_t numel = 1;
    for (auto d : entries[i].shape) numel *= static_cast<uint64_t>(d);
    buf.assign(numel, 0.0f);
    fill(ctx, i, buf.data());
    if (entries[i].dtype == DType::kF32) {
      out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(numel * 4));
    } else {
      half.resize(numel);
      for (uint64_t k = 0; k < numel; ++k) {
        half[k] = entries[i].dtype == DType::kF16 ? FloatToHalf(buf[k]) : FloatToBFloat16(buf[k]);
      }
      out.write(reinterpret_cast<const char*>(half.data()),
                static_cast<std::streamsize>(numel * 2));
    }
  }
  out.close();
  if (!out) return Internal("{}: write failed", tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Internal("{}: rename failed: {}", path, std::strerror(errno));
  }
  return Status::Ok();
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | static_cast<uint32_t>(exp) << 10 | mant >> 13;
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into exponent: correct
  return static_cast<uint16_t>(half);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

}  // namespace failsafe
