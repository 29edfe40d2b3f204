#include "cli/serve/connection_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace kiln::serve {

namespace {

// The numeric host and port of a socket address, formatted as httplib formats them (getnameinfo).
bool host_and_port(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

bool is_connection(int fd, const std::string& remote_addr, int remote_port, int local_port) {
  sockaddr_storage peer{}, local{};
  socklen_t peer_len = sizeof peer, local_len = sizeof local;
  // Fails for anything that is not a connected socket (files, pipes, the listening socket).
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  std::string peer_host, local_host;
  int peer_port = 0, port = 0;
  return host_and_port(peer, peer_len, peer_host, peer_port) &&
         host_and_port(local, local_len, local_host, port) && peer_port == remote_port &&
         port == local_port && peer_host == remote_addr;
}

}  // namespace

ConnectionWatch::ConnectionWatch(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return;
  while (const dirent* entry = readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(fds)) continue;
    if (is_connection(static_cast<int>(fd), remote_addr, remote_port, local_port)) {
      fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(fds);
}

bool ConnectionWatch::closed() const {
  if (fd_ < 0) return false;
  // POLLRDHUP: the peer closed its side (FIN); POLLHUP/POLLERR: reset or gone. Data the client sent early
  // (POLLIN alone) is not a close.
  pollfd p{fd_, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace kiln::serve
