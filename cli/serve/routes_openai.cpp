// OpenAI's images API, so that its official clients work unchanged:
//   client.images.generate(model=..., prompt=..., size="1024x1024", response_format="b64_json",
//                          extra_body={"seed": 1, "steps": 4})
//   client.images.edit(model=..., image=open("in.png", "rb"), mask=open("mask.png", "rb"), prompt=...)
// The answer waits for the images; a client that closes its connection meanwhile cancels its job.
#include <chrono>
#include <ctime>
#include <limits>
#include <optional>
#include <variant>

#include "cli/serve/api_error.h"
#include "cli/serve/base64.h"
#include "cli/serve/connection_watch.h"
#include "cli/serve/edit_form.h"
#include "cli/serve/http_util.h"
#include "cli/serve/routes.h"
#include "cli/serve/submit.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/pipelines/request_fields.h"

namespace kiln::serve {

namespace {

using nlohmann::json;

// How often a waiting handler looks at its client's connection.
constexpr std::chrono::milliseconds kWatchInterval{100};

}  // namespace

std::shared_ptr<Job> run_job_for(const httplib::Request& req, std::string_view body, ServerState& state) {
  return wait_for_job(req, submit_job(body, state), state);
}

std::shared_ptr<Job> wait_for_job(const httplib::Request& req, std::shared_ptr<Job> job, ServerState& state) {
  const ConnectionWatch watch(req.remote_addr, req.remote_port, req.local_port);
  bool client_gone = false;
  while (!job->wait_finished(kWatchInterval)) {
    if (!client_gone && watch.closed()) {
      client_gone = true;
      state.queue.cancel(job->id(), {499, "cancelled", "", "the client closed its connection"});
    }
  }
  const Job::Snapshot end = job->snapshot();
  if (end.status != JobStatus::Succeeded) throw job_error(*end.error);
  return job;
}

namespace {

// OpenAI's answer: the images (base64 or URLs), with Kiln's job, seed and times beside them.
void send_images(const httplib::Request& req, httplib::Response& res, const std::shared_ptr<Job>& job) {
  const Job::Snapshot end = job->snapshot();

  const bool urls = job->params().response_format == ResponseFormat::Url;
  json data = json::array();
  for (size_t i = 0; i < end.images; ++i) {
    if (urls)
      data.push_back({{"url", "http://" + req.get_header_value("Host") + job->image_path(i)}});
    else
      data.push_back({{"b64_json", base64_encode(*job->png(i))}});
  }
  json body = {{"created", static_cast<int64_t>(std::time(nullptr))},
               {"data", data},
               {"output_format", "png"},
               {"kiln",
                {{"job", job->id()},
                 {"seed", job->seed()},
                 {"queue_seconds", end.queue_seconds},
                 {"run_seconds", end.run_seconds}}}};
  const PipelineRequest& asked = job->params().request;
  if (asked.width && asked.height)
    body["size"] = std::to_string(*asked.width) + "x" + std::to_string(*asked.height);
  send_json(res, 200, body);
}

// The request fields a model's class takes and the server reads (those with a JSON name), as the page builds
// its form from them: the JSON name, the label, the kind, the range, the choices, the default (once the model
// is loaded: its pipeline's) and the help.
void generate_images(const httplib::Request& req, httplib::Response& res, ServerState& state) {
  send_images(req, res, run_job_for(req, req.body, state));
}

// POST /v1/images/edits: OpenAI's multipart form (cli/serve/edit_form.h), or a JSON body with the images in
// base64 as POST /v1/images/generations takes them. The model's folder runs it as kiln generate would
// (class_for_job).
void edit_images(const httplib::Request& req, httplib::Response& res, ServerState& state) {
  GenerationParams params;
  try {
    if (req.is_multipart_form_data()) {
      std::vector<FormPart> parts;
      for (const auto& [name, file] : req.files)
        parts.push_back({name, file.filename, file.content_type, file.content});
      params = parse_edit_form(parts);
    } else {
      params = parse_generation_params(req.body);
      if (params.request.image.empty())
        throw RequestError("image", "image: required: the image to edit (a PNG file in base64)");
    }
  } catch (const RequestError& e) {
    throw ApiError(400, "invalid_request_error", e.field(), e.what());
  }
  send_images(req, res, wait_for_job(req, submit_job(std::move(params), state), state));
}

json fields_json(const PipelineClass& c, const std::optional<PipelineDefaults>& defaults) {
  json fields = json::array();
  for (const RequestField& f : request_fields()) {
    if (f.json.empty() || !c.takes(f.name)) continue;
    json field = {{"name", f.name},
                  {"json", f.json},
                  {"label", f.label},
                  {"kind", field_kind_name(f.kind)},
                  {"help", f.help}};
    const bool numeric =
        f.kind == FieldKind::Integer || f.kind == FieldKind::Number || f.kind == FieldKind::IntegerList;
    const double largest = std::numeric_limits<float>::max();
    if (numeric && f.min && *f.min != -largest) field["min"] = *f.min;
    if (numeric && f.max && *f.max != largest) field["max"] = *f.max;
    if (numeric && f.open) field["open"] = true;  // the bounds themselves excluded
    if (!f.choices.empty()) field["choices"] = f.choices;
    if (defaults)
      if (const std::optional<FieldValue> d = default_of(*defaults, f.name))
        std::visit(
            [&](const auto& v) {
              using V = std::decay_t<decltype(v)>;
              if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, double>) field["default"] = v;
            },
            *d);
    fields.push_back(field);
  }
  return fields;
}

// What the model does with an uploaded image (POST /v1/images/edits, the page's upload): whether it takes one
// and a mask, and the classes that run them with the fields they add to the folder's own (strength, ...).
json edits_json(const PipelineClass& folder) {
  json edits = {{"image", false}, {"mask", false}};
  const auto add = [&](const char* key, bool mask) {
    PipelineRequest request;
    request.image.emplace_back();
    if (mask) request.mask_image.emplace();
    try {
      const PipelineClass& runs = class_for_job(folder, request);
      if (!runs.takes("image") || (mask && !runs.takes("mask_image"))) return;
      try {
        runs.check_fields(request);
      } catch (const RequestError& e) {
        if (e.field() == "mask_image") return;  // Fill: no image without a mask
      }
      edits[key] = true;
      json added = json::array();
      for (const json& f : fields_json(runs, std::nullopt))
        if (!folder.takes(f.at("name").get<std::string>())) added.push_back(f);
      edits[std::string(key) + "_pipeline"] = runs.name;
      edits[std::string(key) + "_fields"] = added;
    } catch (const RequestError&) {
      // the folder has no class for it
    }
  };
  add("image", false);
  add("mask", true);
  return edits;
}

json models_json(ModelPool& pool, const LoraLibrary* loras) {
  json data = json::array();
  for (const ModelPool::Model& m : pool.models()) {
    json model = {{"id", m.id},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "kiln"},
                  {"kiln",
                   {{"model", m.ref},
                    {"pipeline", m.pipeline_class->name},
                    // whether its family loads LoRA adapters (the page offers --lora-dir's for it)
                    {"takes_lora",
                     m.pipeline_class->family != nullptr && m.pipeline_class->family->lora.has_value()}}}};
    std::optional<PipelineDefaults> defaults;
    std::string defaults_source;
    if (const auto pipe = pool.loaded(m.id)) {
      defaults = pipe->defaults();
      defaults_source = pipe->recommended_call() ? "recommended_call.json" : "family";
    }
    model["kiln"]["fields"] = fields_json(*m.pipeline_class, defaults);
    model["kiln"]["edits"] = edits_json(*m.pipeline_class);
    if (defaults) {
      const PipelineDefaults& d = *defaults;
      model["kiln"]["loaded"] = true;
      model["kiln"]["defaults"] = {
          {"size", std::to_string(d.width) + "x" + std::to_string(d.height)},
          {"steps", d.num_inference_steps},
          {"guidance", d.guidance_scale},
          {"max_sequence_length", d.max_sequence_length},
          // the model folder's recommended call, or the family's (diffusers') defaults
          {"source", defaults_source}};
    } else {
      model["kiln"]["loaded"] = false;
    }
    data.push_back(model);
  }
  json list = {{"object", "list"}, {"data", data}};
  // The adapters a request may name in "loras" (--lora-dir).
  if (loras != nullptr && loras->enabled()) list["kiln"] = {{"loras", loras->names()}};
  return list;
}

void load_or_unload(const std::string& name, bool load, httplib::Response& res, ServerState& state) {
  const ModelPool::Model* model = state.pool.find(name);
  if (model == nullptr || name.empty())
    throw ApiError(404, "invalid_request_error", "model",
                   "model: '" + name + "' is not served here (GET /v1/models lists them)", "model_not_found");
  if (!load) {
    const bool was = state.pool.unload(model->id);
    send_json(res, 200, {{"id", model->id}, {"loaded", false}, {"was_loaded", was}});
    return;
  }
  // Under --max-memory one model's weights at a time: loading one would unload another mid-job.
  if (state.pool.one_at_a_time())
    throw ApiError(409, "invalid_request_error", "model",
                   "model: under --max-memory models are loaded one at a time, by the job that asks for one; "
                   "submit a job for '" +
                       model->id + "' instead");
  const auto start = std::chrono::steady_clock::now();
  const bool was = state.pool.loaded(model->id) != nullptr;
  try {
    state.pool.acquire(model->id);
  } catch (const std::exception& e) {
    throw ApiError(500, "server_error", "model", "model: '" + model->id + "' failed to load: " + e.what());
  }
  send_json(res, 200,
            {{"id", model->id},
             {"loaded", true},
             {"was_loaded", was},
             {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
}

}  // namespace

void add_openai_routes(httplib::Server& server, ServerState& state) {
  server.Post("/v1/images/generations", [&state](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { generate_images(req, res, state); });
  });
  server.Post("/v1/images/edits", [&state](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { edit_images(req, res, state); });
  });
  server.Get("/v1/models", [&state](const httplib::Request&, httplib::Response& res) {
    guarded(res, [&] { send_json(res, 200, models_json(state.pool, state.loras)); });
  });
  // For operators: load a model now (rather than at its first job), or free its memory.
  server.Post(R"(/v1/models/(.+)/(load|unload))",
              [&state](const httplib::Request& req, httplib::Response& res) {
                guarded(res, [&] { load_or_unload(req.matches[1], req.matches[2] == "load", res, state); });
              });
}

}  // namespace kiln::serve
