// kiln._kiln: the pipelines of the C++ library for the Python package (python/kiln/ gives them diffusers'
// shape). A call runs with the GIL released, on a thread of its own, while the calling thread waits in slices
// and checks for Ctrl-C: an interrupt cancels the call (it stops within one step) and is raised once it has.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "kiln/core/allocator.h"
#include "kiln/core/error.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/runtime/devices.h"
#include "tensors.h"

namespace nb = nanobind;

namespace kiln::python {

namespace {

OutputType parse_output_type(const std::string& name) {
  if (name == "pil" || name == "image") return OutputType::Image;
  if (name == "np" || name == "pt" || name == "array") return OutputType::Array;
  if (name == "latent") return OutputType::Latent;
  throw RequestError("output_type",
                     "output_type must be \"pil\", \"np\", \"pt\" or \"latent\", got \"" + name + "\"");
}

// A device named from Python ("xla-cpu", "cuda:1"), absent when None.
std::optional<Device> optional_device(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  return Device(*name);
}

std::optional<OffloadMode> parse_offload(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  for (OffloadMode m : {OffloadMode::None, OffloadMode::Model, OffloadMode::Group, OffloadMode::Sequential})
    if (*name == offload_mode_name(m)) return m;
  KILN_FAIL("offload: expected none, model, group or sequential, got '" << *name << "'");
}

// An image as an 8-bit HWC array (RGB from PIL), copied into a kiln::Image.
Image to_image(const AnyArray& array) {
  const Tensor t = from_array(array, "image");
  KILN_CHECK(t.dtype() == uint8 && t.dim() == 3 && t.size(2) >= 1 && t.size(2) <= 4,
             "image: expected an 8-bit [height, width, channels] array (1 to 4 channels), got " << t.str());
  Image image;
  image.height = static_cast<int>(t.size(0));
  image.width = static_cast<int>(t.size(1));
  image.channels = static_cast<int>(t.size(2));
  const uint8_t* p = t.data<uint8_t>();
  image.pixels.assign(p, p + t.numel());
  return image;
}

// Runs `call` on a thread of its own with the GIL released; the calling thread checks for signals every 50 ms
// and cancels through `cancel` on a KeyboardInterrupt, which it raises once the call has stopped.
template <class Call>
void run_interruptibly(const CancellationToken& cancel, Call call) {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr failure;
  std::optional<nb::python_error> interrupt;
  {
    nb::gil_scoped_release released;
    std::thread worker([&] {
      try {
        call();
      } catch (...) {
        failure = std::current_exception();
      }
      std::lock_guard lock(mutex);
      done = true;
      finished.notify_all();
    });
    std::unique_lock lock(mutex);
    while (!finished.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; })) {
      if (interrupt) continue;
      lock.unlock();
      {
        nb::gil_scoped_acquire held;
        if (PyErr_CheckSignals() != 0) {
          interrupt.emplace();  // takes the KeyboardInterrupt (or whatever a handler raised)
          cancel.cancel();
        }
      }
      lock.lock();
    }
    lock.unlock();
    worker.join();
  }
  if (interrupt) throw std::move(*interrupt);
  if (failure) std::rethrow_exception(failure);
}

class PyPipeline {
 public:
  static PyPipeline from_pretrained(const std::string& model, const std::string& dtype,
                                    const std::string& revision, const std::string& transformer_file,
                                    std::optional<int64_t> packed_weight_budget, int tensor_parallel,
                                    const std::string& expected_class) {
    PipelineLoadOptions options;
    options.dtype = parse_dtype(dtype);
    options.revision = revision;
    options.transformer_file = transformer_file;
    options.packed_weight_budget = packed_weight_budget;
    options.tensor_parallel = tensor_parallel;
    PyPipeline p;
    nb::gil_scoped_release released;
    // A class asked for by name (FluxPipeline.from_pretrained) refuses a folder of another class before
    // loading anything, as its C++ from_pretrained does.
    p.pipe_ = expected_class.empty() ? DiffusionPipeline::from_pretrained(model, options)
                                     : pipeline_class(expected_class, "from_pretrained").load(model, options);
    return p;
  }

  std::string class_name() const { return pipe_->class_name(); }
  std::string dtype() const { return std::string(dtype_name(pipe_->dtype())); }
  std::string model_path() const { return pipe_->model_path(); }
  std::map<std::string, double> defaults() const {
    const PipelineDefaults d = pipe_->defaults();
    return {{"height", static_cast<double>(d.height)},
            {"width", static_cast<double>(d.width)},
            {"num_inference_steps", d.num_inference_steps},
            {"guidance_scale", d.guidance_scale},
            {"max_sequence_length", static_cast<double>(d.max_sequence_length)}};
  }

  std::vector<std::string> configure(std::optional<std::string> mode, std::optional<std::string> offload,
                                     int blocks_per_group, std::optional<int64_t> max_memory,
                                     std::optional<std::string> device) {
    ExecutionOptions options;
    options.device = optional_device(device);
    if (mode) options.mode = parse_execution_mode(*mode);
    options.offload = parse_offload(offload);
    options.blocks_per_group = blocks_per_group;
    options.max_memory = max_memory;
    nb::gil_scoped_release released;
    return pipe_->configure(options);
  }
  void compile_transformer(bool fullgraph, bool dynamic) {
    nb::gil_scoped_release released;
    pipe_->transformer_module().compile({.fullgraph = fullgraph, .dynamic = dynamic});
  }
  void compile_repeated_blocks() {
    nb::gil_scoped_release released;
    pipe_->transformer_module().compile_repeated_blocks();
  }
  void reset_compiled() { pipe_->transformer_module().reset_compiled(); }
  bool is_compiled() const { return pipe_->transformer_module().is_compiled(); }

  void enable_model_cpu_offload(std::optional<std::string> device) {
    pipe_->enable_model_cpu_offload(optional_device(device));
  }
  void enable_sequential_cpu_offload(int64_t resident_bytes) {
    pipe_->enable_sequential_cpu_offload(resident_bytes);
  }
  void enable_group_offload(int blocks_per_group, bool prefetch, std::optional<std::string> onload_device) {
    pipe_->enable_group_offload({.blocks_per_group = blocks_per_group,
                                 .prefetch = prefetch,
                                 .onload_device = optional_device(onload_device)});
  }
  std::string set_memory_budget(int64_t bytes, std::optional<std::string> device) {
    return pipe_->set_memory_budget(bytes, optional_device(device)).describe();
  }
  void to(const std::string& device) {
    nb::gil_scoped_release released;  // copies every weight to the device
    pipe_->to(Device(device));
  }
  void component_to(const std::string& component, const std::string& device) {
    nb::gil_scoped_release released;
    pipe_->component_to(component, Device(device));
  }
  std::string device() const { return pipe_->device().str(); }
  void enable_vae_tiling(int64_t tile_size) { pipe_->enable_vae_tiling(tile_size); }
  void disable_vae_tiling() { pipe_->disable_vae_tiling(); }

  // LoRA, as diffusers' LoraLoaderMixin; each waits for the calls queued before it.
  std::string load_lora_weights(const std::string& path, const std::string& adapter_name,
                                bool ignore_mismatches) {
    nb::gil_scoped_release released;
    return pipe_
        ->load_lora_weights(path, {.adapter_name = adapter_name, .ignore_mismatches = ignore_mismatches})
        .adapter_name;
  }
  void set_adapters(const std::vector<std::string>& names, const std::vector<double>& weights) {
    nb::gil_scoped_release released;
    pipe_->set_adapters(names, weights);
  }
  void fuse_lora(double lora_scale, const std::vector<std::string>& components) {
    nb::gil_scoped_release released;
    pipe_->fuse_lora({.lora_scale = lora_scale, .components = components});
  }
  void unfuse_lora() {
    nb::gil_scoped_release released;
    pipe_->unfuse_lora();
  }
  void unload_lora_weights() {
    nb::gil_scoped_release released;
    pipe_->unload_lora_weights();
  }
  void delete_adapters(const std::vector<std::string>& names) {
    nb::gil_scoped_release released;
    pipe_->delete_adapters(names);
  }
  std::vector<std::string> get_active_adapters() const { return pipe_->get_active_adapters(); }
  std::map<std::string, std::vector<std::string>> get_list_adapters() const {
    return pipe_->get_list_adapters();
  }

  // One call; see python/kiln/pipelines.py for the arguments' meaning. `on_step(step, num_steps, timestep,
  // latents)` may return new latents (an array) or True to stop, or None.
  nb::dict generate(const std::string& prompt, std::vector<std::string> prompts,
                    std::optional<std::string> prompt_2, std::optional<std::string> prompt_3,
                    std::optional<std::string> negative_prompt, std::optional<std::string> negative_prompt_2,
                    std::optional<std::string> negative_prompt_3, std::vector<std::string> negative_prompts,
                    std::optional<AnyArray> prompt_embeds, std::optional<AnyArray> negative_prompt_embeds,
                    std::optional<AnyArray> pooled_prompt_embeds,
                    std::optional<AnyArray> negative_pooled_prompt_embeds, std::vector<AnyArray> images,
                    std::optional<AnyArray> mask_image, std::optional<double> strength,
                    std::optional<int64_t> padding_mask_crop, std::optional<int64_t> max_area,
                    std::optional<bool> auto_resize, std::optional<int64_t> height,
                    std::optional<int64_t> width, std::optional<int> num_inference_steps,
                    std::optional<float> guidance_scale, std::optional<float> true_cfg_scale,
                    std::optional<uint64_t> seed, std::optional<nb::bytes> generator_state,
                    std::vector<nb::object> generators, std::optional<int64_t> max_sequence_length,
                    int num_images_per_prompt, std::vector<int64_t> skip_guidance_layers,
                    const std::string& output_type, std::optional<nb::callable> on_step,
                    bool widen_bfloat16) {
    PipelineRequest r;
    r.prompt = prompt;
    r.prompts = std::move(prompts);
    r.negative_prompts = std::move(negative_prompts);
    r.prompt_2 = prompt_2;
    r.prompt_3 = prompt_3;
    r.negative_prompt = negative_prompt;
    r.negative_prompt_2 = negative_prompt_2;
    r.negative_prompt_3 = negative_prompt_3;
    if (prompt_embeds) r.prompt_embeds = from_array(*prompt_embeds, "prompt_embeds");
    if (negative_prompt_embeds)
      r.negative_prompt_embeds = from_array(*negative_prompt_embeds, "negative_prompt_embeds");
    if (pooled_prompt_embeds)
      r.pooled_prompt_embeds = from_array(*pooled_prompt_embeds, "pooled_prompt_embeds");
    if (negative_pooled_prompt_embeds)
      r.negative_pooled_prompt_embeds =
          from_array(*negative_pooled_prompt_embeds, "negative_pooled_prompt_embeds");
    for (const AnyArray& image : images) r.image.push_back(to_image(image));
    if (mask_image) r.mask_image = to_image(*mask_image);
    r.strength = strength;
    r.padding_mask_crop = padding_mask_crop;
    r.max_area = max_area;
    r.auto_resize = auto_resize;
    r.height = height;
    r.width = width;
    r.num_inference_steps = num_inference_steps;
    r.guidance_scale = guidance_scale;
    r.true_cfg_scale = true_cfg_scale;
    // A seed, or a torch.Generator's get_state() bytes (one that may have drawn numbers already); a list of
    // either, one per image.
    const auto from_state = [](const nb::bytes& state) {
      return Generator::from_torch_state(reinterpret_cast<const uint8_t*>(state.c_str()), state.size());
    };
    if (seed) r.generator = Generator(*seed);
    if (generator_state) r.generator = from_state(*generator_state);
    for (const nb::object& g : generators)
      r.generators.push_back(nb::isinstance<nb::bytes>(g) ? from_state(nb::cast<nb::bytes>(g))
                                                          : Generator(nb::cast<uint64_t>(g)));
    r.max_sequence_length = max_sequence_length;
    r.num_images_per_prompt = num_images_per_prompt;
    r.skip_layer_guidance.layers = skip_guidance_layers;
    r.output_type = parse_output_type(output_type);
    if (on_step) {
      nb::callable callback = *on_step;
      r.callback_on_step_end = [callback, widen_bfloat16](StepState& s) {
        nb::gil_scoped_acquire held;
        nb::object result = callback(s.step, s.num_steps, s.timestep, to_array(s.latents, widen_bfloat16));
        if (result.is_none()) return;
        if (nb::isinstance<nb::bool_>(result)) {
          s.stop = nb::cast<bool>(result);
          return;
        }
        const Tensor latents = from_array(nb::cast<AnyArray>(result), "callback_on_step_end latents");
        s.latents = latents.dtype() == s.latents.dtype() ? latents : latents.to(s.latents.dtype());
      };
    }
    PipelineOutput out;
    run_interruptibly(r.cancel, [&] { out = (*pipe_)(r); });
    nb::dict result;
    if (out.array.defined()) result["array"] = to_array(out.array);
    if (out.latents.defined()) result["latents"] = to_array(out.latents, widen_bfloat16);
    nb::list images_out;
    for (Image& image : out.images) {
      auto* pixels = new std::vector<uint8_t>(std::move(image.pixels));
      nb::capsule owner(pixels, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
      const size_t shape[3] = {static_cast<size_t>(image.height), static_cast<size_t>(image.width),
                               static_cast<size_t>(image.channels)};
      images_out.append(
          nb::make_tuple(nb::ndarray<nb::numpy, uint8_t>(pixels->data(), 3, shape, owner), image.metadata));
    }
    result["images"] = images_out;
    // Where the generators are after the call, for the caller's torch.Generator objects to continue from.
    const auto state_bytes = [](const Generator& g) {
      const std::vector<uint8_t> s = g.torch_state();
      return nb::bytes(reinterpret_cast<const char*>(s.data()), s.size());
    };
    if (out.generator) result["generator_state"] = state_bytes(*out.generator);
    nb::list states;
    for (const Generator& g : out.generators) states.append(state_bytes(g));
    result["generator_states"] = states;
    return result;
  }

 private:
  std::shared_ptr<DiffusionPipeline> pipe_;
};

}  // namespace

}  // namespace kiln::python

NB_MODULE(_kiln, m) {
  using namespace kiln;
  using namespace kiln::python;
  m.doc() = "Kiln's C++ pipelines; use the kiln package, which gives them diffusers' shape.";

  // Kiln's errors keep their messages: a request's bad field is a ValueError (its field in .field), a
  // cancelled call kiln.Cancelled, any other error kiln.KilnError (a RuntimeError).
  // The types live as long as the interpreter: they are never released (the module holds them too).
  static PyObject* kiln_error = PyErr_NewException("kiln._kiln.KilnError", PyExc_RuntimeError, nullptr);
  static PyObject* request_error = PyErr_NewException("kiln._kiln.RequestError", PyExc_ValueError, nullptr);
  static PyObject* cancelled = PyErr_NewException("kiln._kiln.Cancelled", kiln_error, nullptr);
  m.attr("KilnError") = nb::handle(kiln_error);
  m.attr("RequestError") = nb::handle(request_error);
  m.attr("Cancelled") = nb::handle(cancelled);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const RequestError& e) {
      nb::object error = nb::handle(request_error)(e.what());
      error.attr("field") = e.field();
      PyErr_SetObject(request_error, error.ptr());
    } catch (const Cancelled& e) {
      PyErr_SetString(cancelled, e.what());
    } catch (const Error& e) {
      PyErr_SetString(kiln_error, e.what());
    }
  });

  m.def("pipeline_classes", [] {
    std::vector<std::string> names;
    for (const PipelineClass& c : pipeline_classes()) names.push_back(c.name);
    return names;
  });

  // torch.cuda.memory_stats / max_memory_allocated / reset_peak_memory_stats for any device: the bytes Kiln
  // holds there (arrays, weights brought in and, on a PJRT device, a running program's scratch), the most it
  // held, its limit (a memory budget's), and what the device's plugin reports of its memory (None where it
  // reports nothing: the cpu, the CPU plugin).
  m.def(
      "memory_stats",
      [](const std::string& device) {
        const Device d(device);
        const MemoryStats s = kiln::memory_stats(d);
        const std::optional<DriverMemoryReport> report = driver_memory_report(d);
        return std::map<std::string, std::optional<int64_t>>{
            {"current_bytes", s.current_bytes},
            {"peak_bytes", s.peak_bytes},
            {"allocations", s.allocations},
            {"reserved_bytes", s.reserved_bytes},
            {"system_allocations", s.system_allocations},
            {"limit_bytes", memory_limit(d)},
            {"device_total_bytes", report ? std::optional<int64_t>(report->limit_bytes) : std::nullopt},
            {"device_in_use_bytes", report ? std::optional<int64_t>(report->in_use_bytes) : std::nullopt}};
      },
      nb::arg("device") = "cpu");
  m.def(
      "reset_peak_memory_stats", [](const std::string& device) { reset_peak_memory(Device(device)); },
      nb::arg("device") = "cpu");
  // The devices this build reaches, by name ("cpu", "xla-cpu:0", "cuda:0", ...); `kiln info --devices` says
  // why a type has none.
  m.def("devices", [] {
    std::vector<std::string> names;
    for (const DeviceTypeStatus& status : available_devices())
      for (const DeviceDescription& d : status.devices) names.push_back(d.device.str());
    return names;
  });

  nb::class_<PyPipeline>(m, "Pipeline")
      .def_static("from_pretrained", &PyPipeline::from_pretrained, nb::arg("model"),
                  nb::arg("dtype") = "float32", nb::arg("revision") = "", nb::arg("transformer_file") = "",
                  nb::arg("packed_weight_budget") = nb::none(), nb::arg("tensor_parallel") = 1,
                  nb::arg("expected_class") = "")
      .def_prop_ro("class_name", &PyPipeline::class_name)
      .def_prop_ro("dtype", &PyPipeline::dtype)
      .def_prop_ro("model_path", &PyPipeline::model_path)
      .def("defaults", &PyPipeline::defaults)
      .def("configure", &PyPipeline::configure, nb::arg("mode") = nb::none(), nb::arg("offload") = nb::none(),
           nb::arg("blocks_per_group") = 1, nb::arg("max_memory") = nb::none(),
           nb::arg("device") = nb::none())
      .def("compile_transformer", &PyPipeline::compile_transformer, nb::arg("fullgraph") = true,
           nb::arg("dynamic") = false)
      .def("compile_repeated_blocks", &PyPipeline::compile_repeated_blocks)
      .def("reset_compiled", &PyPipeline::reset_compiled)
      .def_prop_ro("is_compiled", &PyPipeline::is_compiled)
      .def("enable_model_cpu_offload", &PyPipeline::enable_model_cpu_offload, nb::arg("device") = nb::none())
      .def("enable_sequential_cpu_offload", &PyPipeline::enable_sequential_cpu_offload,
           nb::arg("resident_bytes") = 0)
      .def("enable_group_offload", &PyPipeline::enable_group_offload, nb::arg("blocks_per_group") = 1,
           nb::arg("prefetch") = true, nb::arg("onload_device") = nb::none())
      .def("set_memory_budget", &PyPipeline::set_memory_budget, nb::arg("bytes"),
           nb::arg("device") = nb::none())
      .def("to", &PyPipeline::to)
      .def("component_to", &PyPipeline::component_to, nb::arg("component"), nb::arg("device"))
      .def_prop_ro("device", &PyPipeline::device)
      .def("enable_vae_tiling", &PyPipeline::enable_vae_tiling, nb::arg("tile_size") = 0)
      .def("disable_vae_tiling", &PyPipeline::disable_vae_tiling)
      .def("load_lora_weights", &PyPipeline::load_lora_weights, nb::arg("path"), nb::arg("adapter_name") = "",
           nb::arg("ignore_mismatches") = false)
      .def("set_adapters", &PyPipeline::set_adapters, nb::arg("names"), nb::arg("weights"))
      .def("fuse_lora", &PyPipeline::fuse_lora, nb::arg("lora_scale") = 1.0, nb::arg("components"))
      .def("unfuse_lora", &PyPipeline::unfuse_lora)
      .def("unload_lora_weights", &PyPipeline::unload_lora_weights)
      .def("delete_adapters", &PyPipeline::delete_adapters, nb::arg("names"))
      .def("get_active_adapters", &PyPipeline::get_active_adapters)
      .def("get_list_adapters", &PyPipeline::get_list_adapters)
      .def("generate", &PyPipeline::generate, nb::arg("prompt") = "",
           nb::arg("prompts") = std::vector<std::string>(), nb::arg("prompt_2") = nb::none(),
           nb::arg("prompt_3") = nb::none(), nb::arg("negative_prompt") = nb::none(),
           nb::arg("negative_prompt_2") = nb::none(), nb::arg("negative_prompt_3") = nb::none(),
           nb::arg("negative_prompts") = std::vector<std::string>(), nb::arg("prompt_embeds") = nb::none(),
           nb::arg("negative_prompt_embeds") = nb::none(), nb::arg("pooled_prompt_embeds") = nb::none(),
           nb::arg("negative_pooled_prompt_embeds") = nb::none(), nb::arg("images") = std::vector<AnyArray>(),
           nb::arg("mask_image") = nb::none(), nb::arg("strength") = nb::none(),
           nb::arg("padding_mask_crop") = nb::none(), nb::arg("max_area") = nb::none(),
           nb::arg("auto_resize") = nb::none(), nb::arg("height") = nb::none(), nb::arg("width") = nb::none(),
           nb::arg("num_inference_steps") = nb::none(), nb::arg("guidance_scale") = nb::none(),
           nb::arg("true_cfg_scale") = nb::none(), nb::arg("seed") = nb::none(),
           nb::arg("generator_state") = nb::none(), nb::arg("generators") = std::vector<nb::object>(),
           nb::arg("max_sequence_length") = nb::none(), nb::arg("num_images_per_prompt") = 1,
           nb::arg("skip_guidance_layers") = std::vector<int64_t>(), nb::arg("output_type") = "pil",
           nb::arg("on_step") = nb::none(), nb::arg("widen_bfloat16") = false);
}
