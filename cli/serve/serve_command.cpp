// `kiln serve --model M [--model M2 ...]`: keeps the pipelines loaded and generates images for HTTP clients:
// OpenAI's images API, Kiln's job API with progress events, and a web page (docs/serve.md). The pipelines
// are loaded and configured by the flags `kiln generate` takes (cli/execution_flags.h).
//
// SIGINT or SIGTERM drains the server: new jobs are refused, waiting jobs are cancelled, running jobs stop
// at their next step, the answers in flight are written, and the process exits 0. The server writes no files.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "cli/execution_flags.h"
#include "cli/serve/api_key.h"
#include "cli/serve/http_server.h"
#include "cli/serve/job_queue.h"
#include "cli/serve/job_runner.h"
#include "cli/serve/tensor_parallel_jobs.h"
#include "kiln/core/error.h"
#include "kiln/core/signals.h"
#include "kiln/dist/local_ranks.h"
#include "kiln/dist/process_group.h"
#include "kiln/io/model_summary.h"
#include "kiln/pipelines/loaded_weights.h"
#include "kiln/pipelines/weight_packing.h"

namespace kiln::cli {

namespace {

struct ServeArgs {
  std::vector<std::string> models;
  std::string host = "127.0.0.1";
  int port = 8188;
  size_t queue = 16;
  size_t keep_jobs = 64;
  std::string api_key;
  std::string lora_dir;
  std::string models_dir;
  ExecutionFlags execution;
};

void check_serve_args(const ServeArgs& args) {
  check_execution_flags(args.execution);
  KILN_CHECK(!args.api_key.empty() || serve::is_loopback_host(args.host),
             "--host " << args.host
                       << " serves beyond this machine: give an --api-key KEY (or set KILN_API_KEY) that "
                          "clients send as `Authorization: Bearer KEY`");
}

// Loads a model's pipeline and applies the execution flags, its components computing on `device`, reporting
// both on stderr (rank 0).
std::unique_ptr<DiffusionPipeline> load_pipeline(const std::string& ref, const ExecutionFlags& flags,
                                                 const Device& device) {
  const bool reporting = dist::rank() == 0;
  if (reporting) std::fprintf(stderr, "kiln: loading %s\n", ref.c_str());
  const auto start = std::chrono::steady_clock::now();
  PipelineLoadOptions options = load_options_from(flags);
  // A stop asked for while a large model loads ends the load between components.
  options.on_component_loaded = [&](const std::string& name, int, int) {
    throw_if_stop_requested("after loading " + ref + ": " + name);
  };
  std::unique_ptr<DiffusionPipeline> pipe = DiffusionPipeline::from_pretrained(ref, options);
  for (const std::string& line : configure_pipeline(*pipe, flags, device))
    if (reporting) std::fprintf(stderr, "kiln: %s\n", line.c_str());
  if (const auto line = placement_line(*pipe, device); line && reporting)
    std::fprintf(stderr, "kiln: %s\n", line->c_str());
  // The packed copies are the cpu's matmuls'; on a device they are never made, so the plan is not reported.
  if (reporting)
    std::fprintf(stderr, "kiln: loaded %s (%s) in %.1fs%s%s\n", ref.c_str(), pipe->class_name(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 device.type == DeviceType::CPU ? "; " : "",
                 device.type == DeviceType::CPU ? pipe->weight_packing().describe().c_str() : "");
  return pipe;
}

void log_job_end(const serve::Job& job) {
  const serve::Job::Snapshot s = job.snapshot();
  const serve::GenerationParams& p = job.params();
  const std::string size = p.request.width && p.request.height
                               ? std::to_string(*p.request.width) + "x" + std::to_string(*p.request.height)
                               : "default size";
  std::fprintf(stderr, "kiln: %s %s %s, seed %llu: %s after %d step(s) in %.2fs (queued %.2fs)%s%s\n",
               job.id().c_str(), job.model().c_str(), size.c_str(),
               static_cast<unsigned long long>(job.seed()), serve::status_name(s.status), s.step,
               s.run_seconds, s.queue_seconds, s.error ? ": " : "", s.error ? s.error->message.c_str() : "");
}

// The server on one rank (the only one without --tp): rank r's pipelines compute on the device r places after
// `first_device`; rank 0 serves HTTP and announces each job, the others make the same calls.
void serve_on_rank(const ServeArgs& args, const Device& first_device) {
  const Device device = device_of_rank(first_device, dist::rank());
  require_device(device);
  // --models-dir's folders are loaded when first asked for; under --max-memory every model is.
  std::vector<std::string> models = args.models;
  if (!args.models_dir.empty()) {
    std::vector<std::pair<std::string, std::string>> skipped;
    for (const std::string& folder : serve::ModelPool::folders_in(args.models_dir, &skipped))
      if (std::find(models.begin(), models.end(), folder) == models.end()) models.push_back(folder);
    if (dist::rank() == 0)
      for (const auto& [folder, why] : skipped)
        std::fprintf(stderr, "kiln: --models-dir: skipped %s: %s\n", folder.c_str(), why.c_str());
  }
  serve::ModelPool::Policy policy{
      .on_demand = args.execution.max_memory.has_value() || !args.models_dir.empty(),
      .one_at_a_time = args.execution.max_memory.has_value()};
  if (args.execution.max_memory) {
    // Under --max-memory the models share the budget: each counted by the weights it will read (as `kiln
    // info` counts them), the least recently used unloaded to make room.
    policy.budget = parse_byte_budget(*args.execution.max_memory, "--max-memory");
    const int64_t bytes_per_parameter = static_cast<int64_t>(dtype_size(parse_dtype(args.execution.dtype)));
    policy.estimate = [bytes_per_parameter](const std::string& ref) {
      const io::ModelSummary summary = io::summarize_model(ref);
      int64_t parameters = 0;
      for (const io::ComponentSummary& c : summary.components)
        if (c.has_weights) parameters += loaded_weights(summary, c).parameters;
      return parameters * bytes_per_parameter;
    };
  }
  serve::ModelPool pool(
      models, [&](const std::string& ref) { return load_pipeline(ref, args.execution, device); }, policy);
  if (!policy.on_demand) pool.load_all();
  // Every rank loaded (or failed to, which ends the others here instead of behind a server that cannot run).
  if (dist::world_size() > 1) {
    uint8_t loaded = 1;
    dist::broadcast_from_rank0(&loaded, sizeof loaded);
  }

  const serve::LoraLibrary loras(args.lora_dir);
  if (dist::rank() != 0) {
    serve::follow_rank0(pool, loras);
    return;
  }

  const bool tensor_parallel = dist::world_size() > 1;
  // The jobs run on the queue's worker thread: with in-process ranks it acts as this (rank 0's) thread, so
  // that its collectives meet the other ranks'.
  const auto as_rank0 = dist::as_this_rank();
  serve::Metrics metrics;
  // Under --tp one job at a time: every rank must make the same calls in the same order.
  const size_t lanes = tensor_parallel ? 1 : pool.lanes();
  serve::JobQueue queue(
      {.capacity = args.queue, .keep_finished = args.keep_jobs}, lanes,
      [&](const std::string& model) { return tensor_parallel ? 0 : pool.lane_of(model); },
      [&](serve::Job& job) {
        as_rank0([&] {
          serve::run_job(job, pool, metrics, loras,
                         tensor_parallel ? serve::announce_job : std::function<void(const serve::Job&)>());
        });
      },
      [&](const serve::Job& job) {
        metrics.job_ended(job.snapshot());
        log_job_end(job);
      });
  serve::ServerState state{pool, queue, metrics, args.api_key, {}, &loras};
  if (device.type != DeviceType::CPU) {
    const int ranks = dist::in_local_ranks() ? dist::world_size() : 1;
    for (int r = 0; r < ranks; ++r) state.devices.push_back(device_of_rank(first_device, r));
  }
  // A connection per waiting client, event stream or request: enough for a full queue, each running job,
  // and the page's and monitors' requests besides.
  serve::HttpServer http(state, args.queue + lanes + 16);
  const int port = http.bind(args.host, args.port);
  http.start();
  const bool ipv6 = args.host.find(':') != std::string::npos;
  // The pid says whom to signal: under mpirun, rank 0 (mpirun itself exits 1 when it is signalled, though it
  // passes the signal on and every rank drains).
  std::fprintf(stderr, "kiln: serving %zu model(s) on http://%s%s%s:%d/ (queue %zu%s; pid %d)\n",
               pool.models().size(), ipv6 ? "[" : "", args.host.c_str(), ipv6 ? "]" : "", port, args.queue,
               args.api_key.empty() ? "" : ", API key required", static_cast<int>(getpid()));

  // In-process ranks: one that fails (it threw past its follower loop) leaves no group to run jobs with, so
  // the server stops with its error rather than failing every job.
  std::optional<std::string> rank_failure;
  while (!stop_requested() && !(rank_failure = dist::local_group_failure()))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::fprintf(stderr, "kiln: stopping: cancelling %zu waiting and %zu running job(s)\n", queue.waiting(),
               queue.running());
  queue.shutdown({503, "server_error", "", "the server is shutting down"});
  http.stop();
  KILN_CHECK(!rank_failure, "kiln serve: " << *rank_failure);
  if (tensor_parallel) serve::announce_stop();
  std::fprintf(stderr, "kiln: stopped\n");
}

void run_serve(const ServeArgs& args) {
  check_serve_args(args);
  run_on_tensor_parallel_ranks(args.execution, "serve",
                               [&](const Device& device) { serve_on_rank(args, device); });
  dist::destroy_process_group();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand(
      "serve", "Serve image generation over HTTP: OpenAI's images API, Kiln's job API and a web page");
  cmd->add_option(
         "--model", args->models,
         "a diffusers folder or Hugging Face repo id in the local cache; repeat for several. Clients "
         "name a model by its folder's name (or repo id); the first is the default")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--host", args->host,
                  "address to listen on; anything but a loopback address needs --api-key")
      ->capture_default_str();
  cmd->add_option("--port", args->port, "TCP port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--queue", args->queue,
                  "jobs that may wait for their turn; more are refused with 503 and Retry-After")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  cmd->add_option("--keep-jobs", args->keep_jobs,
                  "finished jobs (and their images) kept for GET /v1/jobs/{id}; older ones are forgotten")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--api-key", args->api_key,
                  "require `Authorization: Bearer KEY` on every request but the page and /health (read from "
                  "KILN_API_KEY when not given)")
      ->envname("KILN_API_KEY");
  cmd->add_option(
      "--models-dir", args->models_dir,
      "serve every model folder in DIR (its subfolders with a model_index.json of a class Kiln runs), "
      "each loaded when a job or POST /v1/models/{id}/load first asks for it");
  cmd->add_option(
      "--lora-dir", args->lora_dir,
      "the LoRA adapters requests may name: DIR's <name>.safetensors files, asked for with \"loras\": "
      "[{\"name\": ..., \"scale\": ...}] and applied to that job only");
  add_execution_flags(*cmd, args->execution, "serves HTTP");
  cmd->callback([args] { run_serve(*args); });
}

}  // namespace kiln::cli
