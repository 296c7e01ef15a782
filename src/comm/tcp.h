// TCP sockets of the coordinator's services (the gloo rendezvous store, the
// listener where devices on other hosts join) and of their clients. Every
// descriptor is close-on-exec; connected ones have TCP_NODELAY (the
// protocols send small frames and wait for the answer).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace failsafe {

struct TcpListener {
  int fd = -1;   // listening; the caller owns it
  int port = 0;  // bound port (the one asked for, or the free one port 0 got)
};

// Binds host:port (an IPv4 address or name; port 0: any free port) and
// listens.
Result<TcpListener> TcpListen(const std::string& host, int port);

// Connects to host:port (any address family the name resolves to), trying
// again every retry_ms while nobody listens yet, for up to timeout_ms.
// kInvalidArgument if the name does not resolve, kUnavailable past the time.
Result<int> TcpConnect(const std::string& host, int port, int64_t timeout_ms,
                       int64_t retry_ms = 20);

// For a descriptor accept() gave.
void SetTcpNoDelay(int fd);

// The local address of a connected socket, as text ("127.0.0.1" if unknown).
std::string LocalAddress(int fd);
// The address of a connected socket's peer, as text ("" if unknown); an
// IPv4 peer of an IPv6 socket as IPv4.
std::string PeerAddress(int fd);

}  // namespace failsafe
