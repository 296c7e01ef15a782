// Shared bits of the HTTP library comparison servers.
#pragma once
#include <time.h>
#include <cstdint>
#include <cstdio>
inline int64_t NowNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}
// A token chunk like the server's SSE frames (~180 bytes).
static const char kFrame[] =
    "data: "
    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"m\",\"choices\":[{"
    "\"index\":0,\"text\":\" token\",\"logprobs\":null,\"finish_reason\":null}]}\n\n";
