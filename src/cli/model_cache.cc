#include "cli/model_cache.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <filesystem>

#include "common/log.h"
#include "model/synthetic.h"

namespace failsafe {

namespace fs = std::filesystem;

std::string DefaultCacheDir(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/failsafe";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/failsafe";
  return "/tmp/failsafe-cache";
}

int RemoveStaleModelTemps(const std::string& cache_dir) {
  std::error_code ec;
  const fs::path models = fs::path(DefaultCacheDir(cache_dir)) / "models";
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(models, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos) continue;
    const std::string pid_text = name.substr(at + 5);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos ||
        pid_text.size() > 9)
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    fs::remove_all(entry.path(), ec);
    if (!ec) {
      FS_LOG_INFO("removed {}, left by process {} that is gone", entry.path().string(), pid);
      ++removed;
    }
  }
  return removed;
}

Status EnsureSyntheticModel(const std::string& dir, const std::string& preset, uint64_t seed) {
  std::error_code ec;
  if (fs::exists(dir + "/config.json", ec)) return Status::Ok();
  fs::create_directories(fs::path(dir).parent_path(), ec);
  std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  FS_LOG_INFO("creating synthetic model '{}' in {}", preset, dir);
  SyntheticModelOptions o;
  o.preset = preset;
  o.seed = seed;
  Status st = WriteSyntheticModel(tmp, o);
  if (!st.ok()) {
    fs::remove_all(tmp, ec);
    return st;
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);  // another process finished first
    if (!fs::exists(dir + "/config.json")) return Internal("{}: could not create the model", dir);
  }
  return Status::Ok();
}

Result<std::string> ResolveModel(const std::string& model_dir, const std::string& cache_dir,
                                 const std::string& preset) {
  RemoveStaleModelTemps(cache_dir);
  if (!model_dir.empty()) return model_dir;
  std::string dir = DefaultCacheDir(cache_dir) + "/models/" + preset + "-seed0";
  FS_RETURN_IF_ERROR(EnsureSyntheticModel(dir, preset, 0));
  return dir;
}

}  // namespace failsafe
