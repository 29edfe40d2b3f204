// GET /health (open to all, for liveness probes and the web page) and GET /metrics (Prometheus).
#include "cli/serve/http_util.h"
#include "cli/serve/routes.h"

namespace kiln::serve {

namespace {

Metrics::Gauges gauges(const ServerState& state) {
  return {.queue_length = state.queue.waiting(),
          .running = state.queue.running(),
          .models = state.pool.models().size(),
          .models_loaded = state.pool.loaded_count(),
          .devices = state.devices};
}

}  // namespace

void add_status_routes(httplib::Server& server, ServerState& state) {
  server.Get("/health", [&state](const httplib::Request&, httplib::Response& res) {
    guarded(res, [&] {
      const Metrics::Gauges g = gauges(state);
      send_json(res, 200,
                {{"status", "ok"},
                 {"models", g.models},
                 {"models_loaded", g.models_loaded},
                 {"queue_length", g.queue_length},
                 {"running", g.running},
                 {"api_key_required", !state.api_key.empty()}});
    });
  });
  server.Get("/metrics", [&state](const httplib::Request&, httplib::Response& res) {
    guarded(res, [&] { res.set_content(state.metrics.render(gauges(state)), "text/plain; version=0.0.4"); });
  });
}

}  // namespace kiln::serve
