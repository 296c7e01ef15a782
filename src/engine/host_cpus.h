// The CPUs this process may use: its affinity mask, and a cgroup CPU quota
// (a container's CPU limit), whichever is tighter. A quota of 2 CPUs on a
// 64-CPU host lets the process run on all 64, but only for 2 CPUs' time per
// period: threads that spin while they wait use that time up as surely as
// threads that work.
#pragma once

#include <string>

namespace failsafe {

// The CPUs a cgroup CPU quota allows the process (the quota over its period,
// rounded up), the tightest along its cgroup and the cgroup's ancestors up
// to the hierarchy's mount: cgroup v2's cpu.max, v1's cpu.cfs_quota_us and
// cpu.cfs_period_us. 0 if no quota is set or none can be read.
// `proc_cgroup` and `mountinfo` are the texts of /proc/self/cgroup and
// /proc/self/mountinfo; the quota files are read where the mounts say.
int CgroupCpuQuota(const std::string& proc_cgroup, const std::string& mountinfo);

// The CPUs this process may use: its affinity mask's count, lowered to its
// cgroup's CPU quota where one is set; at least 1.
int HostCpus();

}  // namespace failsafe
