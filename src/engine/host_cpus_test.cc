#include "engine/host_cpus.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/scratch_dir.h"

namespace failsafe {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

// mountinfo lines for a cgroup v2 mount at `point` and a v1 cpu mount, the
// hierarchies' roots as given.
std::string V2Mount(const std::string& point, const std::string& root = "/") {
  return "30 22 0:26 " + root + " " + point +
         " rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
}
std::string V1CpuMount(const std::string& point, const std::string& root = "/") {
  return "33 25 0:29 " + root + " " + point +
         " rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n";
}
const std::string kOtherMounts =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "34 25 0:30 / /sys/fs/cgroup/memory rw,relatime shared:10 - cgroup cgroup rw,memory\n";

TEST(CgroupCpuQuota, V2QuotaOverPeriodRoundedUpTightestAncestor) {
  ScratchDir tmp("cgroup");
  const std::string mnt = tmp.Sub("unified");
  Write(mnt + "/cpu.max", "max 100000\n");
  Write(mnt + "/kubepods/cpu.max", "350000 100000\n");  // 3.5 CPUs: 4
  Write(mnt + "/kubepods/pod/cpu.max", "max 100000\n");
  Write(mnt + "/kubepods/pod/ctr/cpu.max", "max 100000\n");
  const std::string info = kOtherMounts + V2Mount(mnt);
  EXPECT_EQ(CgroupCpuQuota("0::/kubepods/pod/ctr\n", info), 4);
  // A tighter limit further down wins.
  Write(mnt + "/kubepods/pod/cpu.max", "150000 100000\n");
  EXPECT_EQ(CgroupCpuQuota("0::/kubepods/pod/ctr\n", info), 2);
  // Less than one CPU's time is one CPU.
  Write(mnt + "/kubepods/pod/ctr/cpu.max", "20000 100000\n");
  EXPECT_EQ(CgroupCpuQuota("0::/kubepods/pod/ctr\n", info), 1);
  // No quota anywhere: 0.
  EXPECT_EQ(CgroupCpuQuota("0::/\n", info), 0);
}

TEST(CgroupCpuQuota, V2InANamespaceWhoseRootIsTheContainer) {
  ScratchDir tmp("cgroup");
  const std::string mnt = tmp.Sub("fs cgroup");  // a space, escaped in mountinfo
  Write(mnt + "/cpu.max", "200000 100000\n");
  std::string escaped = mnt;
  escaped.replace(escaped.find(' '), 1, "\\040");
  EXPECT_EQ(CgroupCpuQuota("0::/\n", V2Mount(escaped)), 2);
  // The process's cgroup shown under a mount of a sub-hierarchy.
  EXPECT_EQ(CgroupCpuQuota("0::/system.slice/app\n", V2Mount(escaped, "/system.slice/app")), 2);
  // A cgroup the mount does not show is not read.
  EXPECT_EQ(CgroupCpuQuota("0::/elsewhere\n", V2Mount(escaped, "/system.slice/app")), 0);
}

TEST(CgroupCpuQuota, V1CfsQuota) {
  ScratchDir tmp("cgroup");
  const std::string mnt = tmp.Sub("cpu");
  Write(mnt + "/cpu.cfs_quota_us", "-1\n");
  Write(mnt + "/cpu.cfs_period_us", "100000\n");
  Write(mnt + "/docker/abc/cpu.cfs_quota_us", "300000\n");
  Write(mnt + "/docker/abc/cpu.cfs_period_us", "100000\n");
  const std::string info = kOtherMounts + V1CpuMount(mnt);
  const std::string cgroup = "9:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n";
  EXPECT_EQ(CgroupCpuQuota(cgroup, info), 3);
  // Docker without a cgroup namespace: the mount's root is the container's.
  const std::string own = tmp.Sub("own");
  Write(own + "/cpu.cfs_quota_us", "50000\n");
  Write(own + "/cpu.cfs_period_us", "10000\n");
  EXPECT_EQ(CgroupCpuQuota(cgroup, V1CpuMount(own, "/docker/abc")), 5);
  // Unlimited (-1), the cpu controller missing, or files that cannot be
  // read: no quota.
  EXPECT_EQ(CgroupCpuQuota("4:cpu,cpuacct:/\n", info), 0);
  EXPECT_EQ(CgroupCpuQuota("9:memory:/docker/abc\n", info), 0);
  EXPECT_EQ(CgroupCpuQuota(cgroup, V1CpuMount(tmp.Sub("missing"))), 0);
  EXPECT_EQ(CgroupCpuQuota("", ""), 0);
  EXPECT_EQ(CgroupCpuQuota("garbage\n::\n", "garbage - line\n"), 0);
}

TEST(HostCpus, AtLeastOneAndNoMoreThanTheAffinityMask) {
  const int cpus = HostCpus();
  EXPECT_GE(cpus, 1);
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_LE(cpus, CPU_COUNT(&set));
}

}  // namespace
}  // namespace failsafe
