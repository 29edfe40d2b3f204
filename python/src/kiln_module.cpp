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
#include "kiln/pipelines/request_fields.h"
#include "kiln/runtime/device_ledger.h"
#include "kiln/runtime/devices.h"
#include "tensors.h"

namespace nb = nanobind;

namespace kiln::python {

namespace {

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

// A generator from Python: an int seed, or a torch.Generator's get_state() bytes (one that may have drawn
// numbers already: its stream continues).
Generator generator_of(nb::handle value) {
  if (nb::isinstance<nb::bytes>(value)) {
    const nb::bytes state = nb::borrow<nb::bytes>(value);
    return Generator::from_torch_state(reinterpret_cast<const uint8_t*>(state.c_str()), state.size());
  }
  return Generator(nb::cast<uint64_t>(value));
}

// A Python value as the value of `field`, by its kind (python/kiln/_request.py has made images arrays,
// tensors DLPack-able arrays and generators seeds or torch states). A value of another type is a RequestError
// naming the field.
FieldValue field_value(const RequestField& field, nb::handle value) {
  try {
    switch (field.kind) {
      case FieldKind::Text:
      case FieldKind::Choice:
        return nb::cast<std::string>(value);
      case FieldKind::TextList:
        return nb::cast<std::vector<std::string>>(value);
      case FieldKind::Integer:
        return nb::cast<int64_t>(value);
      case FieldKind::IntegerList:
        return nb::cast<std::vector<int64_t>>(value);
      case FieldKind::Number:
        return nb::cast<double>(value);
      case FieldKind::Boolean:
        return nb::cast<bool>(value);
      case FieldKind::Image:
        return to_image(nb::cast<AnyArray>(value));
      case FieldKind::ImageList: {
        std::vector<Image> images;
        for (nb::handle item : value) images.push_back(to_image(nb::cast<AnyArray>(item)));
        return images;
      }
      case FieldKind::Tensor:
        return from_array(nb::cast<AnyArray>(value), field.name.c_str());
      case FieldKind::Generator:
        return generator_of(value);
      case FieldKind::GeneratorList: {
        std::vector<Generator> generators;
        for (nb::handle item : value) generators.push_back(generator_of(item));
        return generators;
      }
    }
  } catch (const nb::cast_error&) {
  } catch (const nb::python_error&) {
  }
  const std::string type = nb::cast<std::string>(nb::str(value.type().attr("__name__")));
  throw RequestError(field.name, field.python_name() + " must be " + field.accepted() + ", got " + type);
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

  // diffusers' from_pipe: the class `target` holding `source`'s components (kiln::pipeline_from_pipe).
  static PyPipeline from_pipe(const PyPipeline& source, const std::string& target) {
    PyPipeline p;
    p.pipe_ = pipeline_from_pipe(pipeline_class(target, "from_pipe"), *source.pipe_);
    return p;
  }

  std::string class_name() const { return pipe_->class_name(); }
  std::string dtype() const { return std::string(dtype_name(pipe_->dtype())); }
  std::string model_path() const { return pipe_->model_path(); }
  std::string defaults_source() const { return pipe_->defaults_source(); }
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
    pipe_->denoiser().compile({.fullgraph = fullgraph, .dynamic = dynamic});
  }
  // diffusers' transformer.enable_cache / disable_cache (kiln/nn/step_cache.h), the config as its spec.
  void enable_cache(const std::string& spec) { pipe_->denoiser().enable_cache(parse_step_cache(spec)); }
  void disable_cache() { pipe_->denoiser().disable_cache(); }

  void compile_repeated_blocks() {
    nb::gil_scoped_release released;
    pipe_->denoiser().compile_repeated_blocks();
  }
  void reset_compiled() { pipe_->denoiser().reset_compiled(); }
  bool is_compiled() const { return pipe_->denoiser().is_compiled(); }

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

  // One call: `fields` maps request fields (by name) to values of their kinds (python/kiln/_request.py
  // converts diffusers' keyword arguments). `on_step(step, num_steps, timestep, latents)` may return new
  // latents (an array) or True to stop, or None.
  static PipelineRequest request_of(const nb::dict& fields) {
    PipelineRequest r;
    for (const auto& [key, value] : fields) {
      const std::string name = nb::cast<std::string>(key);
      const RequestField* field = find_request_field(name);
      if (field == nullptr) throw RequestError(name, "no request field " + name);
      field->set(r, field_value(*field, value));
    }
    return r;
  }

  // The checks a call makes before it runs (RequestError naming the field), without running it.
  void check(const nb::dict& fields) const { pipe_->check_request(request_of(fields)); }

  nb::dict generate(const nb::dict& fields, std::optional<nb::callable> on_step, bool widen_bfloat16) {
    PipelineRequest r = request_of(fields);
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
    for (const PipelineClass* c : pipeline_classes()) names.push_back(c->name);
    return names;
  });
  // The registry (kiln/pipelines/pipeline_registry.h), for the package to make its classes: each class's
  // name, family, task and the request fields it takes.
  m.def("pipeline_class_info", [] {
    nb::list out;
    for (const PipelineClass* c : pipeline_classes()) {
      nb::dict info;
      info["name"] = c->name;
      info["family"] = c->family->name;
      info["task"] = task_name(c->task);
      info["fields"] = c->fields;
      out.append(info);
    }
    return out;
  });
  // The request's fields (kiln/pipelines/request_fields.h): the package reads diffusers' keyword arguments
  // by them.
  m.def("request_fields", [] {
    nb::list out;
    for (const RequestField& f : request_fields()) {
      nb::dict info;
      info["name"] = f.name;
      info["keyword"] = f.python_name();
      info["kind"] = field_kind_name(f.kind);
      info["list_form"] = f.list_form;
      info["help"] = f.help;
      out.append(info);
    }
    return out;
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
            {"limit_bytes", total_memory_limit(d)},
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
      .def_static("from_pipe", &PyPipeline::from_pipe, nb::arg("source"), nb::arg("target"))
      .def("defaults", &PyPipeline::defaults)
      .def("defaults_source", &PyPipeline::defaults_source)
      .def("configure", &PyPipeline::configure, nb::arg("mode") = nb::none(), nb::arg("offload") = nb::none(),
           nb::arg("blocks_per_group") = 1, nb::arg("max_memory") = nb::none(),
           nb::arg("device") = nb::none())
      .def("compile_transformer", &PyPipeline::compile_transformer, nb::arg("fullgraph") = true,
           nb::arg("dynamic") = false)
      .def("compile_repeated_blocks", &PyPipeline::compile_repeated_blocks)
      .def("enable_cache", &PyPipeline::enable_cache, nb::arg("spec"))
      .def("disable_cache", &PyPipeline::disable_cache)
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
      .def("check", &PyPipeline::check, nb::arg("fields"))
      .def("generate", &PyPipeline::generate, nb::arg("fields"), nb::arg("on_step") = nb::none(),
           nb::arg("widen_bfloat16") = false);
}
