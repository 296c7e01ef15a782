#include "common/scratch_dir.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

namespace failsafe {

ScratchDir::ScratchDir(std::string_view tag) : owner_(::getpid()) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / ("fs_" + std::string(tag) + "_XXXXXX")).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    std::fprintf(stderr, "cannot create a scratch directory %s: %s\n", pattern.c_str(),
                 std::strerror(errno));
    std::abort();
  }
  path_ = buf.data();
}

ScratchDir::~ScratchDir() { Remove(); }

ScratchDir::ScratchDir(ScratchDir&& other) noexcept
    : path_(std::exchange(other.path_, {})), owner_(other.owner_) {}

ScratchDir& ScratchDir::operator=(ScratchDir&& other) noexcept {
  if (this != &other) {
    Remove();
    path_ = std::exchange(other.path_, {});
    owner_ = other.owner_;
  }
  return *this;
}

std::string ScratchDir::Sub(std::string_view name) const {
  return (std::filesystem::path(path_) / name).string();
}

void ScratchDir::Remove() {
  if (path_.empty() || ::getpid() != owner_) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  path_.clear();
}

const ScratchDir& ProcessScratchDir() {
  static const ScratchDir dir(std::to_string(::getpid()));
  return dir;
}

}  // namespace failsafe
