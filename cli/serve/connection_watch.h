// Whether the client of a request being answered has gone away, so that its job can be cancelled.
// cpp-httplib 0.11 (Debian 12's) tells a handler nothing about its connection (later versions added
// Request::is_connection_closed), but it does give the two addresses of the connection, and a TCP
// connection is the one socket of this process with exactly those: the watch finds it once, then asks the
// kernel whether the peer has closed or reset it. The handler never reads from or writes to the socket.
#pragma once

#include <string>

namespace kiln::serve {

class ConnectionWatch {
 public:
  // The connection from remote_addr:remote_port to local_port on this host (httplib::Request's fields).
  ConnectionWatch(const std::string& remote_addr, int remote_port, int local_port);
  // True once the peer has closed or reset the connection; false while it is open, and when the socket was
  // not found (a watch never cancels a job it cannot see).
  bool closed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace kiln::serve
