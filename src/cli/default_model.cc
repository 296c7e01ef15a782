#include "cli/default_model.h"

#include <filesystem>
#include <string_view>

#include "cli/model_cache.h"
#include "common/log.h"
#include "model/file_util.h"

// The files, assembled into the program (.incbin). FAILSAFE_STORIES_ID is a
// digest of their contents, so a changed file rebuilds this object.
#define FS_EMBED(sym, file)                                                           \
  asm(".pushsection .rodata\n.balign 16\n.global " #sym "\n" #sym                     \
      ":\n.incbin \"" FAILSAFE_STORIES_DIR "/" file "\"\n.global " #sym "_end\n" #sym \
      "_end:\n.popsection\n");                                                        \
  extern "C" const char sym[], sym##_end[];

FS_EMBED(fs_stories_config, "config.json")
FS_EMBED(fs_stories_generation_config, "generation_config.json")
FS_EMBED(fs_stories_safetensors, "model.safetensors")
FS_EMBED(fs_stories_tokenizer, "tokenizer.json")
FS_EMBED(fs_stories_tokenizer_config, "tokenizer_config.json")

namespace failsafe {

namespace fs = std::filesystem;

namespace {

struct File {
  const char* name;
  const char* begin;
  const char* end;
};

}  // namespace

Result<std::string> EnsureDefaultModel(const std::string& cache_dir) {
  const std::string dir = cache_dir + "/models/" + kDefaultModelName + "-" + FAILSAFE_STORIES_ID;
  FS_RETURN_IF_ERROR(EnsureModelDir(dir, [&](const std::string& tmp) -> Status {
    std::error_code ec;
    fs::create_directories(tmp, ec);
    if (ec) return Internal("{}: cannot create: {}", tmp, ec.message());
    FS_LOG_INFO("writing the default model ({}) to {}", kDefaultModelName, dir);
    const File files[] = {
        {"model.safetensors", fs_stories_safetensors, fs_stories_safetensors_end},
        {"tokenizer.json", fs_stories_tokenizer, fs_stories_tokenizer_end},
        {"tokenizer_config.json", fs_stories_tokenizer_config, fs_stories_tokenizer_config_end},
        {"generation_config.json", fs_stories_generation_config, fs_stories_generation_config_end},
        {"config.json", fs_stories_config, fs_stories_config_end}};
    for (const File& f : files) {
      FS_RETURN_IF_ERROR(WriteStringToFile(
          tmp + "/" + f.name, std::string(f.begin, static_cast<size_t>(f.end - f.begin))));
    }
    return Status::Ok();
  }));
  return dir;
}

}  // namespace failsafe
