// AUTOMATIC1111's web UI API, the one many front-ends speak: POST /sdapi/v1/txt2img and /img2img answer
// {"images": [base64 PNG, ...], "parameters": the body as given, "info": a JSON string of what ran (seed,
// size, steps, model)}. The body becomes Kiln's generation request (cli/serve/a1111_params.h); its errors are
// Kiln's (400 naming the A1111 field).
#include <utility>
#include <vector>

#include "cli/serve/a1111_params.h"
#include "cli/serve/base64.h"
#include "cli/serve/http_util.h"
#include "cli/serve/routes.h"

namespace kiln::serve {

namespace {

using nlohmann::json;

// txt2img or img2img: the body as Kiln's request, its job, and A1111's answer.
void run_a1111(const httplib::Request& req, httplib::Response& res, ServerState& state, bool img2img) {
  std::string body;
  try {
    body = img2img ? a1111_img2img_body(req.body) : a1111_txt2img_body(req.body);
  } catch (const RequestError& e) {
    throw ApiError(400, "invalid_request_error", e.field(), e.what());
  }
  std::shared_ptr<Job> job;
  try {
    job = run_job_for(req, body, state);
  } catch (const ApiError& e) {
    // Kiln's field names back to A1111's, in the field and in the message.
    static const std::vector<std::pair<std::string, std::string>> names = {
        {"guidance", "cfg_scale"},
        {"n", "batch_size"},
        {"size", "width"},
        {"steps", "steps"},
        {"strength", "denoising_strength"},
        {"image", "init_images"},
        {"mask_image", "mask"},
        {"padding_mask_crop", "inpaint_full_res"}};
    for (const auto& [kiln_name, a1111] : names) {
      if (e.param != kiln_name) continue;
      std::string message = e.what();
      if (message.rfind(kiln_name + ":", 0) == 0) message = a1111 + message.substr(kiln_name.size());
      ApiError renamed(e.status, e.type, a1111, message, e.code);
      renamed.retry_after = e.retry_after;
      throw renamed;
    }
    throw;
  }
  json images = json::array();
  for (size_t i = 0; i < job->snapshot().images; ++i) images.push_back(base64_encode(*job->png(i)));
  json parameters = json::parse(req.body, nullptr, false);
  const PipelineRequest& asked = job->params().request;
  json info = {{"seed", job->seed()}, {"job", job->id()}, {"model", job->model()}};
  if (asked.width && asked.height) {
    info["width"] = *asked.width;
    info["height"] = *asked.height;
  }
  send_json(res, 200, {{"images", images}, {"parameters", parameters}, {"info", info.dump()}});
}

}  // namespace

void add_a1111_routes(httplib::Server& server, ServerState& state) {
  server.Post("/sdapi/v1/txt2img", [&state](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { run_a1111(req, res, state, false); });
  });
  server.Post("/sdapi/v1/img2img", [&state](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { run_a1111(req, res, state, true); });
  });
}

}  // namespace kiln::serve
