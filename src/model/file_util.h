// Small file helpers shared by the model readers and writers.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace failsafe {

Result<std::string> ReadFileToString(const std::string& path);
// Writes atomically: to path.tmp, then rename.
Status WriteStringToFile(const std::string& path, const std::string& data);

// A read-only memory map of a whole file. Move-only; unmaps on destruction.
class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace failsafe
