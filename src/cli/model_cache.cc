#include "cli/model_cache.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "cli/default_model.h"
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

Status EnsureModelDir(const std::string& dir,
                      const std::function<Status(const std::string& tmp)>& write) {
  std::error_code ec;
  if (fs::exists(dir + "/config.json", ec)) return Status::Ok();
  fs::create_directories(fs::path(dir).parent_path(), ec);
  std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  Status st = write(tmp);
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

Status EnsureSyntheticModel(const std::string& dir, const std::string& preset, uint64_t seed) {
  return EnsureModelDir(dir, [&](const std::string& tmp) {
    FS_LOG_INFO("creating synthetic model '{}' in {}", preset, dir);
    SyntheticModelOptions o;
    o.preset = preset;
    o.seed = seed;
    return WriteSyntheticModel(tmp, o);
  });
}

Result<std::string> ResolveModel(const std::string& model_dir, const std::string& cache_dir,
                                 const std::string& preset) {
  if (!model_dir.empty()) return model_dir;
  std::string dir = DefaultCacheDir(cache_dir) + "/models/" + preset + "-seed0";
  FS_RETURN_IF_ERROR(EnsureSyntheticModel(dir, preset, 0));
  return dir;
}

Result<std::string> ResolveModelOrDefault(const std::string& model_dir,
                                          const std::string& cache_dir) {
  if (!model_dir.empty()) return model_dir;
  return EnsureDefaultModel(DefaultCacheDir(cache_dir));
}

}  // namespace failsafe
