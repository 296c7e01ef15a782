// The llama2.c converter: the committed stories260K files are exactly what it
// writes, and bad input is named. (That the converted model writes the
// published story is checked in engine/stories_test.cc; its logits against a
// PyTorch forward pass of the original checkpoint in tests/python.)
#include "model/llama2c.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "model/file_util.h"

namespace failsafe {
namespace {

const std::string kModel = std::string(FAILSAFE_DATA_DIR) + "/models/stories260K";

class TempDir {
 public:
  TempDir()
      : path_((std::filesystem::temp_directory_path() /
               ("fs_llama2c_test_" + std::to_string(::getpid())))
                  .string()) {}
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Llama2c, ConversionReproducesTheCommittedFiles) {
  TempDir out;
  Llama2cConversion c;
  c.checkpoint = kModel + "/llama2c/stories260K.bin";
  c.tokenizer_model = kModel + "/llama2c/tok512.model";
  c.out_dir = out.path();
  ASSERT_TRUE(ConvertLlama2c(c).ok());
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors",
                        "tokenizer.json", "tokenizer_config.json"}) {
    auto got = ReadFileToString(out.path() + "/" + f);
    auto want = ReadFileToString(kModel + "/" + f);
    ASSERT_TRUE(got.ok() && want.ok()) << f;
    EXPECT_TRUE(*got == *want) << f << " differs from the committed file";
  }
}

TEST(Llama2c, RefusesWhatIsNotACheckpoint) {
  TempDir out;
  std::filesystem::create_directories(out.path());
  auto bin = ReadFileToString(kModel + "/llama2c/stories260K.bin");
  ASSERT_TRUE(bin.ok());
  ASSERT_TRUE(WriteStringToFile(out.path() + "/short.bin", bin->substr(0, bin->size() - 4)).ok());
  Llama2cConversion c;
  c.checkpoint = out.path() + "/short.bin";
  c.tokenizer_model = kModel + "/llama2c/tok512.model";
  c.out_dir = out.path() + "/m";
  Status st = ConvertLlama2c(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("bytes, but a checkpoint of this shape has"), std::string::npos)
      << st.message();
  c.checkpoint = kModel + "/config.json";
  st = ConvertLlama2c(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a llama2.c checkpoint"), std::string::npos) << st.message();
  c.checkpoint = kModel + "/llama2c/stories260K.bin";
  c.tokenizer_model = std::string(FAILSAFE_DATA_DIR) + "/tokenizers/llama-2/tokenizer.model";
  st = ConvertLlama2c(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("32000 pieces"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace failsafe
