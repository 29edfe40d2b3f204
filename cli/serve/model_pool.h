// The models `kiln serve` serves (--model, repeated, and the folders of --models-dir), by name, and their
// loaded pipelines. Without a memory budget, pipelines of different models run side by side: every --model is
// loaded at start and stays loaded, or (with --models-dir) each model when a job first asks for it. With one
// (--max-memory), a model is loaded when a job first asks for it, and the model loaded before it is unloaded
// first: the budget holds one model's weights at a time (each configured with that budget, as `kiln generate
// --max-memory` does), and their jobs run one at a time. With an estimate of each model's weights, the budget
// holds as many models as fit, the least recently used unloaded first to make room. An operator may load or
// unload a model by name. A job that edits an image on a text-to-image folder runs the folder's
// image-to-image or inpainting class, made from the loaded pipeline (from_pipe: the same weights) and kept
// while it is.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/pipelines/pipeline_registry.h"

namespace kiln::serve {

class ModelPool {
 public:
  // Loads and configures the pipeline of a model, given its --model value.
  using Loader = std::function<std::unique_ptr<DiffusionPipeline>(const std::string& ref)>;
  // The bytes a model's weights will hold once loaded (before loading it), given its --model value.
  using Estimate = std::function<int64_t(const std::string& ref)>;

  struct Model {
    std::string id;   // what clients name it (GET /v1/models): a repo id as given, else the folder's name
    std::string ref;  // the --model value (recorded in the images' "model" text chunk)
    const PipelineClass* pipeline_class = nullptr;  // from its model_index.json
  };

  struct Policy {
    bool on_demand = false;      // load a model when a job (or an operator) first asks for it, not at start
    bool one_at_a_time = false;  // under a memory budget: one job at a time, the models' weights within it
    int64_t budget = 0;  // that budget in bytes; with `estimate`, models share it (LRU), else one at a time
    Estimate estimate;
  };

  // Reads each model's model_index.json (nothing is loaded yet); throws naming a model that is missing, of a
  // class Kiln does not run, or whose id another model has.
  ModelPool(const std::vector<std::string>& refs, Loader load, Policy policy);

  // The model folders in `dir` (its subfolders holding a model_index.json of a class Kiln runs), sorted; each
  // folder it skips goes to `skipped` with the reason.
  static std::vector<std::string> folders_in(const std::string& dir,
                                             std::vector<std::pair<std::string, std::string>>* skipped);

  // Loads every model now (without a budget: at start, so that a model that cannot load stops the server
  // before it listens).
  void load_all();

  const std::vector<Model>& models() const { return models_; }
  // The model a request names: its id or its --model value; the first model when `name` is empty. Null when
  // none matches.
  const Model* find(const std::string& name) const;
  bool on_demand() const { return policy_.on_demand; }
  bool one_at_a_time() const { return policy_.one_at_a_time; }
  // How many models may run at once (JobQueue lanes), and which lane runs a model's jobs.
  size_t lanes() const { return policy_.one_at_a_time ? 1 : models_.size(); }
  size_t lane_of(const std::string& id) const;

  // The model's pipeline if it is loaded now, else null; as class `as` (a class of the same folders, as
  // pipeline_from_pipe takes) when given.
  std::shared_ptr<DiffusionPipeline> loaded(const std::string& id, const PipelineClass* as = nullptr);
  // The model's pipeline, loaded first when it is not (unloading the other model under a budget), as class
  // `as` when given. A thread that asks while another loads the same model waits for that load.
  std::shared_ptr<DiffusionPipeline> acquire(const std::string& id, const PipelineClass* as = nullptr);
  // Forgets the model's pipeline (a job running on it keeps it until it ends); false when it was not loaded.
  bool unload(const std::string& id);
  size_t loaded_count() const;

 private:
  size_t index_of(const std::string& id) const;

  const Loader load_;
  const Policy policy_;
  std::vector<Model> models_;
  mutable std::mutex mutex_;
  std::condition_variable loaded_cv_;
  std::vector<std::shared_ptr<DiffusionPipeline>> pipelines_;  // by index in models_; null: not loaded
  // By index: the classes made from the loaded pipeline (from_pipe), by name.
  std::vector<std::map<std::string, std::shared_ptr<DiffusionPipeline>>> siblings_;
  std::vector<bool> loading_;        // by index: a thread is loading it now
  std::vector<uint64_t> last_used_;  // by index: acquire's tick when last asked for
  std::vector<int64_t> estimates_;   // by index: the weights' bytes (-1: not yet)
  uint64_t tick_ = 0;
  // Under a budget with estimates: unloads the least recently used models (not `keep`) until `need` more
  // bytes fit beside the loaded ones. Called with the lock held.
  void make_room(size_t keep, int64_t need);
  int64_t estimate_of(size_t i);
  // Model i's pipeline and what was made of it forgotten (a job running on one keeps it). Lock held.
  void forget(size_t i);
  // Model i's loaded `pipe` as class `as`. Lock held.
  std::shared_ptr<DiffusionPipeline> as_class(size_t i, const std::shared_ptr<DiffusionPipeline>& pipe,
                                              const PipelineClass* as);
};

}  // namespace kiln::serve
