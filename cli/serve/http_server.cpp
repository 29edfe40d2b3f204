#include "cli/serve/http_server.h"

#include <httplib.h>

#include <chrono>

#include "cli/serve/api_key.h"
#include "cli/serve/http_util.h"
#include "cli/serve/routes.h"
#include "kiln/core/error.h"

namespace kiln::serve {

namespace {

// What anyone may fetch without the API key: the page (it holds no secret, and asks for the key itself)
// and the health check.
bool is_public(const std::string& path) {
  return path == "/health" || is_page_path(path);
}

// Answers without a route of their own, as JSON errors.
ApiError error_for_status(int status, const httplib::Request& req) {
  switch (status) {
    case 404:
      return ApiError(404, "not_found_error", "", "no route for " + req.method + " " + req.path);
    case 413:
      return ApiError(
          413, "invalid_request_error", "",
          "the request body is larger than the maximum " + std::to_string(kMaxRequestBodyBytes) + " bytes");
    case 400:
      // httplib reads a multipart form itself, before any route: a form it cannot split ends here.
      if (req.is_multipart_form_data())
        return ApiError(400, "invalid_request_error", "",
                        "the multipart form could not be read: expected multipart/form-data with a boundary "
                        "parameter, each part opened by the boundary and closed by the final one (RFC 7578)");
      [[fallthrough]];
    default:
      return ApiError(status, "invalid_request_error", "",
                      "the request could not be served (HTTP " + std::to_string(status) + ")");
  }
}

}  // namespace

HttpServer::HttpServer(ServerState& state, size_t threads) : server_(std::make_unique<httplib::Server>()) {
  httplib::Server& s = *server_;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(kMaxRequestBodyBytes);
  s.set_keep_alive_max_count(100);
  s.set_pre_routing_handler([&state](const httplib::Request& req, httplib::Response& res) {
    if (state.api_key.empty() || is_public(req.path)) return httplib::Server::HandlerResponse::Unhandled;
    if (bearer_matches(req.get_header_value("Authorization"), state.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "authentication_error", "",
                             req.has_header("Authorization")
                                 ? "the API key is not this server's (Authorization: Bearer KEY)"
                                 : "this server needs an API key: send Authorization: Bearer KEY",
                             "invalid_api_key"));
    res.set_header("WWW-Authenticate", "Bearer");
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    // Routes answer their own errors with a body; only the bare statuses httplib sets get one here.
    if (res.body.empty()) send_error(res, error_for_status(res.status, req));
  });
  s.set_logger([&state](const httplib::Request&, const httplib::Response& res) {
    state.metrics.http_answer(res.status);
  });
  add_openai_routes(s, state);
  add_a1111_routes(s, state);
  add_job_routes(s, state);
  add_status_routes(s, state);
  add_page_routes(s);
}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::bind(const std::string& host, int port) {
  if (port == 0) {
    const int bound = server_->bind_to_any_port(host);
    KILN_CHECK(bound > 0,
               "kiln serve: cannot listen on " << host << " (any port): is it an address of this machine?");
    return bound;
  }
  KILN_CHECK(server_->bind_to_port(host, port),
             "kiln serve: cannot listen on " << host << ":" << port
                                             << ": is another server on that port (--port picks another), or "
                                                "the address not one of this machine's?");
  return port;
}

void HttpServer::start() {
  listening_done_ = false;
  listener_ = std::thread([this] {
    server_->listen_after_bind();
    listening_done_ = true;
  });
  // stop() can only stop a server that runs: wait for it to (or for it to have given up).
  while (!server_->is_running() && !listening_done_)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void HttpServer::stop() {
  server_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace kiln::serve
