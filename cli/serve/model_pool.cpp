#include "cli/serve/model_pool.h"

#include <algorithm>
#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/io/model_index.h"
#include "kiln/io/model_ref.h"

namespace kiln::serve {

namespace {

// A repo id from the Hugging Face cache keeps its name ("black-forest-labs/FLUX.1-schnell"); a folder is
// named by its last component ("/models/flux-schnell/" is "flux-schnell").
std::string model_id(const std::string& ref, const io::ResolvedModel& resolved) {
  if (resolved.from_cache()) return ref;
  std::filesystem::path p(ref);
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() || name == "." || name == ".." ? ref : name;
}

}  // namespace

ModelPool::ModelPool(const std::vector<std::string>& refs, Loader load, Policy policy)
    : load_(std::move(load)), policy_(policy) {
  KILN_CHECK(!refs.empty(),
             "kiln serve: give at least one --model (or a --models-dir holding model folders)");
  for (const std::string& ref : refs) {
    const io::ResolvedModel resolved = io::resolve_model(ref);
    const io::ModelIndex index = io::load_model_index(resolved.path);
    Model model{model_id(ref, resolved), ref, &pipeline_class(index.class_name, index.path)};
    for (const Model& other : models_)
      KILN_CHECK(other.id != model.id && other.ref != model.ref,
                 "--model " << ref << ": its name '" << model.id << "' is also the name of --model "
                            << other.ref
                            << "; clients could not tell them apart (rename or link one of the folders)");
    models_.push_back(std::move(model));
  }
  pipelines_.resize(models_.size());
  siblings_.resize(models_.size());
  loading_.resize(models_.size(), false);
  last_used_.resize(models_.size(), 0);
  estimates_.resize(models_.size(), -1);
}

int64_t ModelPool::estimate_of(size_t i) {
  if (estimates_[i] < 0) estimates_[i] = std::min(policy_.estimate(models_[i].ref), policy_.budget);
  return estimates_[i];
}

void ModelPool::make_room(size_t keep, int64_t need) {
  for (;;) {
    int64_t held = 0;
    size_t oldest = models_.size();
    for (size_t j = 0; j < models_.size(); ++j) {
      if (!pipelines_[j] || j == keep) continue;
      held += estimate_of(j);
      if (oldest == models_.size() || last_used_[j] < last_used_[oldest]) oldest = j;
    }
    if (held + need <= policy_.budget || oldest == models_.size()) return;
    forget(oldest);  // a job running on it keeps it until it ends
  }
}

void ModelPool::forget(size_t i) {
  pipelines_[i].reset();
  siblings_[i].clear();
}

std::shared_ptr<DiffusionPipeline> ModelPool::as_class(size_t i,
                                                       const std::shared_ptr<DiffusionPipeline>& pipe,
                                                       const PipelineClass* as) {
  if (as == nullptr || as == &pipe->registered_class()) return pipe;
  if (pipelines_[i] != pipe) return pipeline_from_pipe(*as, *pipe);  // unloaded meanwhile: not kept
  std::shared_ptr<DiffusionPipeline>& sibling = siblings_[i][as->name];
  if (!sibling) sibling = pipeline_from_pipe(*as, *pipe);
  return sibling;
}

std::vector<std::string> ModelPool::folders_in(const std::string& dir,
                                               std::vector<std::pair<std::string, std::string>>* skipped) {
  namespace fs = std::filesystem;
  std::error_code error;
  KILN_CHECK(fs::is_directory(dir, error), "--models-dir " << dir << ": not a folder");
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, error)) {
    if (!e.is_directory(error)) continue;
    const std::string path = e.path().string();
    if (!fs::is_regular_file(e.path() / "model_index.json", error)) {
      if (skipped) skipped->emplace_back(path, "no model_index.json");
      continue;
    }
    try {
      const io::ModelIndex index = io::load_model_index(path);
      pipeline_class(index.class_name, index.path);
      out.push_back(path);
    } catch (const Error& err) {
      if (skipped) skipped->emplace_back(path, err.what());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void ModelPool::load_all() {
  for (const Model& model : models_) acquire(model.id);
}

const ModelPool::Model* ModelPool::find(const std::string& name) const {
  if (name.empty()) return &models_.front();
  for (const Model& model : models_)
    if (model.id == name || model.ref == name) return &model;
  return nullptr;
}

size_t ModelPool::index_of(const std::string& id) const {
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].id == id) return i;
  KILN_FAIL("kiln serve: no model named '" << id << "'");
}

size_t ModelPool::lane_of(const std::string& id) const {
  return policy_.one_at_a_time ? 0 : index_of(id);
}

std::shared_ptr<DiffusionPipeline> ModelPool::loaded(const std::string& id, const PipelineClass* as) {
  const size_t i = index_of(id);
  std::lock_guard lock(mutex_);
  return pipelines_[i] ? as_class(i, pipelines_[i], as) : nullptr;
}

std::shared_ptr<DiffusionPipeline> ModelPool::acquire(const std::string& id, const PipelineClass* as) {
  const size_t i = index_of(id);
  {
    std::unique_lock lock(mutex_);
    // Another thread (an operator's load, or the model's lane) is loading it: its load serves both.
    loaded_cv_.wait(lock, [&] { return !loading_[i]; });
    last_used_[i] = ++tick_;
    if (pipelines_[i]) return as_class(i, pipelines_[i], as);
    // Under a budget the models loaded before go first, so that they never hold more than it together: the
    // least recently used until this one fits (with estimates), else all of them. (A handler checking a
    // request against one may hold it a moment longer.)
    if (policy_.one_at_a_time) {
      if (policy_.estimate) {
        make_room(i, estimate_of(i));
      } else {
        for (size_t j = 0; j < models_.size(); ++j) forget(j);
      }
    }
    loading_[i] = true;
  }
  // Loading takes long: outside the lock, so that requests are still checked and answered meanwhile.
  std::shared_ptr<DiffusionPipeline> pipe;
  try {
    pipe = load_(models_[i].ref);
  } catch (...) {
    std::lock_guard lock(mutex_);
    loading_[i] = false;
    loaded_cv_.notify_all();
    throw;
  }
  std::lock_guard lock(mutex_);
  forget(i);
  pipelines_[i] = pipe;
  loading_[i] = false;
  loaded_cv_.notify_all();
  return as_class(i, pipe, as);
}

bool ModelPool::unload(const std::string& id) {
  const size_t i = index_of(id);
  std::lock_guard lock(mutex_);
  const bool was = pipelines_[i] != nullptr;
  forget(i);
  return was;
}

size_t ModelPool::loaded_count() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto& p : pipelines_) n += p != nullptr;
  return n;
}

}  // namespace kiln::serve
