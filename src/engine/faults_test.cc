#include "engine/faults.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/scratch_dir.h"

namespace failsafe {
namespace {

std::string Trace(const std::string& name, const std::string& text) {
  const std::string path = ProcessScratchDir().Sub(name);
  std::ofstream(path) << text;
  return path;
}

// A time that is not wholly a finite, non-negative number of ms is an error
// naming the line: "12abc" used to fire at 12 ms and "nan" never.
TEST(FaultTrace, TimesMustBeWholeFiniteNumbers) {
  for (const std::string bad : {"12abc", "nan", "inf", "-5", "", "1e400", "0x10"}) {
    const std::string path = Trace("bad_time", "1000,remove,0\n" + bad + ",add,0\n");
    auto f = ParseFaults({"trace=" + path}, 4);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().message(), path + ":2: '" + bad + "' is not a time in ms");
  }
  auto ok = ParseFaults({"trace=" + Trace("good", "1000,remove,2\n2500.5,add,2\r\n")}, 4);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_DOUBLE_EQ((*ok)[1].at_s, 2.5005);
}

// Named nodes get devices in order of appearance, so a trace that also uses
// device numbers would give two nodes one device.
TEST(FaultTrace, NodesAreNamedOneWay) {
  const std::string path = Trace("mixed", "1000,remove,0\n2000,remove,nodeA\n");
  auto f = ParseFaults({"trace=" + path}, 4);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(path + ":2: node 'nodeA'"), std::string::npos)
      << f.status().message();
  auto named = ParseFaults({"trace=" + Trace("named", "1000,remove,b\n2000,remove,a\n")}, 4);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_EQ((*named)[0].device, 0);
  EXPECT_EQ((*named)[1].device, 1);
}

}  // namespace
}  // namespace failsafe
