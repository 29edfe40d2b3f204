// The HTTP side of `kiln serve` (cpp-httplib): the routes, the API key check, JSON errors for anything the
// routes do not answer (unknown paths, bodies over the limit), a thread per connection from a bounded pool,
// and a clean stop.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "cli/serve/server_state.h"

namespace httplib {
class Server;
}

namespace kiln::serve {

class HttpServer {
 public:
  // `threads`: connections served at once (each waiting client, event stream and request holds one).
  HttpServer(ServerState& state, size_t threads);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds to host:port (port 0: any free port) and returns the port; throws kiln::Error naming the address
  // when it cannot.
  int bind(const std::string& host, int port);
  // Accepts connections on a thread of its own until stop().
  void start();
  // Closes the listening socket, then waits for the connections being served to finish.
  void stop();

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  std::atomic<bool> listening_done_{false};
};

}  // namespace kiln::serve
