#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace failsafe {
namespace {

std::string MakeFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  out += std::string(data_bytes, '\0');
  return out;
}

Status Parse(const std::string& file) {
  return ParseSafetensorsHeader(reinterpret_cast<const unsigned char*>(file.data()), file.size(),
                                "f.safetensors")
      .status();
}

TEST(Safetensors, ParsesValidHeader) {
  auto f = MakeFile(R"({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
                        "__metadata__": {"format": "pt"}})",
                    32);
  auto r = ParseSafetensorsHeader(reinterpret_cast<const unsigned char*>(f.data()), f.size(), "f");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
}

TEST(Safetensors, RejectsLies) {
  EXPECT_NE(Parse("abc").message().find("truncated"), std::string::npos);
  std::string lying_len = MakeFile("{}", 0);
  lying_len[0] = 100;
  EXPECT_NE(Parse(lying_len).message().find("truncated"), std::string::npos);
  EXPECT_NE(Parse(MakeFile(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", 8))
                .message()
                .find("outside"),
            std::string::npos);
  EXPECT_NE(Parse(MakeFile(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8))
                .message()
                .find("need"),
            std::string::npos);
  EXPECT_NE(Parse(MakeFile(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8))
                .message()
                .find("unsupported dtype"),
            std::string::npos);
  EXPECT_NE(Parse(MakeFile(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                           12))
                .message()
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(Parse(MakeFile(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8))
                .message()
                .find("shape"),
            std::string::npos);
  EXPECT_NE(Parse(MakeFile(R"([1,2])", 0)).message().find("not a JSON object"), std::string::npos);
}

TEST(Safetensors, HalfConversionsRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1e-5f, 3.0e-7f, 0.1f}) {
    EXPECT_NEAR(HalfToFloat(FloatToHalf(f)), f, std::fabs(f) * 1e-3 + 1e-7) << f;
    EXPECT_NEAR(BFloat16ToFloat(FloatToBFloat16(f)), f, std::fabs(f) * 8e-3 + 1e-30) << f;
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half round-trips exactly
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h);
  }
}

class SyntheticModelTest : public ::testing::Test {
 protected:
  std::string Dir(const std::string& name) {
    auto d = std::filesystem::temp_directory_path() /
             ("fs_model_test_" + std::to_string(::getpid()) + "_" + name);
    dirs_.push_back(d);
    return d.string();
  }
  void TearDown() override {
    for (auto& d : dirs_) std::filesystem::remove_all(d);
  }
  std::vector<std::filesystem::path> dirs_;
};

TEST_F(SyntheticModelTest, WritesLoadableModelsInEveryDtypeAndSharding) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int shards : {1, 3}) {
      std::string dir = Dir(std::string(DTypeName(dt)) + std::to_string(shards));
      SyntheticModelOptions o;
      o.preset = "tiny-mixtral";
      o.seed = 5;
      o.dtype = dt;
      o.num_shards = shards;
      ASSERT_TRUE(WriteSyntheticModel(dir, o).ok());
      auto c = ModelConfig::Load(dir);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      auto w = WeightStore::Open(dir, *c);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      TensorRef q = (*w)->Get("model.layers.1.self_attn.q_proj.weight");
      EXPECT_EQ(q.info->dtype, dt);
      std::vector<float> rows(2 * 256);
      q.ReadRows(3, 2, rows.data());
      std::vector<float> cols(256 * 2);
      q.ReadColsTransposed(5, 2, cols.data());
      EXPECT_EQ(cols[0 * 256 + 3], rows[0 * 256 + 5]);  // element [3][5]
      EXPECT_EQ(cols[1 * 256 + 4], rows[1 * 256 + 6]);  // element [4][6]
    }
  }
}

TEST_F(SyntheticModelTest, SameSeedSameBytes) {
  std::string a = Dir("a"), b = Dir("b"), c = Dir("c");
  SyntheticModelOptions o;
  o.seed = 11;
  ASSERT_TRUE(WriteSyntheticModel(a, o).ok());
  ASSERT_TRUE(WriteSyntheticModel(b, o).ok());
  o.seed = 12;
  ASSERT_TRUE(WriteSyntheticModel(c, o).ok());
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(a + "/model.safetensors"), read(b + "/model.safetensors"));
  EXPECT_NE(read(a + "/model.safetensors"), read(c + "/model.safetensors"));
}

TEST_F(SyntheticModelTest, WrongShapeIsNamed) {
  std::string dir = Dir("bad");
  ASSERT_TRUE(WriteSyntheticModel(dir, {}).ok());
  // Claim a larger hidden size than the weights have.
  auto c = ModelConfig::Load(dir);
  ASSERT_TRUE(c.ok());
  ModelConfig bigger = *c;
  bigger.intermediate_size *= 2;
  auto w = WeightStore::Open(dir, bigger);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(
                "model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight': field 'shape'"),
            std::string::npos)
      << w.status().message();
}

// Gemma3ForConditionalGeneration as published (language_model.model.) and as
// newer transformers save it (model.language_model.), in one file and in
// shards: the language model's tensors read under the text model's names with
// the text layout's values; the vision tower's and projector's are left unread.
TEST_F(SyntheticModelTest, ReadsTheLanguageModelOfAVisionLanguageCheckpoint) {
  SyntheticModelOptions o;
  o.preset = "micro-gemma3";
  o.seed = 9;
  o.dtype = DType::kBF16;
  const std::string text = Dir("vl_text");
  ASSERT_TRUE(WriteSyntheticModel(text, o).ok());
  auto tc = ModelConfig::Load(text);
  ASSERT_TRUE(tc.ok()) << tc.status().ToString();
  auto tw = WeightStore::Open(text, *tc);
  ASSERT_TRUE(tw.ok()) << tw.status().ToString();
  EXPECT_EQ((*tw)->skipped_tensors(), 0);
  for (const char* prefix : {"language_model.model.", "model.language_model."}) {
    for (int shards : {1, 3}) {
      SCOPED_TRACE(std::string(prefix) + " in " + std::to_string(shards));
      const std::string dir = Dir(std::string("vl_") + prefix + std::to_string(shards));
      o.vision_language_prefix = prefix;
      o.num_shards = shards;
      ASSERT_TRUE(WriteSyntheticModel(dir, o).ok());
      auto c = ModelConfig::Load(dir);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_TRUE(c->vision_language);
      ModelConfig same = *c;
      same.vision_language = false;
      EXPECT_EQ(same.ToJson(), tc->ToJson());
      auto w = WeightStore::Open(dir, *c);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      EXPECT_EQ((*w)->skipped_tensors(), 23);  // a one-layer SigLIP tower and the projector
      EXPECT_GT((*w)->skipped_bytes(), 0);
      EXPECT_EQ((*w)->MatrixDType(), DType::kBF16);
      for (const ExpectedTensor& e : ExpectedTensors(*c)) {
        TensorRef a = (*w)->Get(e.name), b = (*tw)->Get(e.name);
        ASSERT_EQ(a.info->end - a.info->begin, b.info->end - b.info->begin) << e.name;
        EXPECT_EQ(std::memcmp(a.data, b.data, a.info->end - a.info->begin), 0) << e.name;
      }
      // Read as a text model, the same files are refused by the prefixed name.
      auto as_text = WeightStore::Open(dir, *tc);
      ASSERT_FALSE(as_text.ok());
      EXPECT_NE(as_text.status().message().find(std::string("tensor '") + prefix),
                std::string::npos)
          << as_text.status().message();
    }
  }
}

}  // namespace
}  // namespace failsafe
