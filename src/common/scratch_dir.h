// Directories for files that live no longer than the process or an object:
// unique names from mkdtemp under the system's temporary directory, removed
// with everything in them when their owner goes away. A forked child that
// exits never removes its parent's directories.
#pragma once

#include <sys/types.h>
#include <string>
#include <string_view>

namespace failsafe {

class ScratchDir {
 public:
  // Creates <tmp>/fs_<tag>_XXXXXX; aborts if the directory cannot be made.
  explicit ScratchDir(std::string_view tag);
  ~ScratchDir();
  ScratchDir(ScratchDir&& other) noexcept;
  ScratchDir& operator=(ScratchDir&& other) noexcept;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name (not created).
  std::string Sub(std::string_view name) const;

 private:
  void Remove();

  std::string path_;
  pid_t owner_ = 0;
};

// One scratch directory for the whole process, made at first use and removed
// at exit: for fixtures built once and shared by every test of a program.
const ScratchDir& ProcessScratchDir();

}  // namespace failsafe
