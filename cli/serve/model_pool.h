// The models `kiln serve` was started with (--model, repeated), by name, and their loaded pipelines.
// Without a memory budget every model is loaded at start and stays loaded, and pipelines of different models
// run side by side. With one (--max-memory), a model is loaded when a job first asks for it, and the model
// loaded before it is unloaded first: the budget holds one model's weights at a time (each configured with
// that budget, as `kiln generate --max-memory` does), and their jobs run one at a time.
#pragma once

#include <functional>
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

  struct Model {
    std::string id;   // what clients name it (GET /v1/models): a repo id as given, else the folder's name
    std::string ref;  // the --model value (recorded in the images' "model" text chunk)
    const PipelineClass* pipeline_class = nullptr;  // from its model_index.json
  };

  // Reads each model's model_index.json (nothing is loaded yet); throws naming a model that is missing, of a
  // class Kiln does not run, or whose id another model has.
  ModelPool(const std::vector<std::string>& refs, Loader load, bool load_on_demand);

  // Loads every model now (without a budget: at start, so that a model that cannot load stops the server
  // before it listens).
  void load_all();

  const std::vector<Model>& models() const { return models_; }
  // The model a request names: its id or its --model value; the first model when `name` is empty. Null when
  // none matches.
  const Model* find(const std::string& name) const;
  bool load_on_demand() const { return load_on_demand_; }
  // How many models may run at once (JobQueue lanes), and which lane runs a model's jobs.
  size_t lanes() const { return load_on_demand_ ? 1 : models_.size(); }
  size_t lane_of(const std::string& id) const;

  // The model's pipeline if it is loaded now, else null.
  std::shared_ptr<DiffusionPipeline> loaded(const std::string& id) const;
  // The model's pipeline, loaded first when it is not (unloading the other model under a budget).
  std::shared_ptr<DiffusionPipeline> acquire(const std::string& id);
  size_t loaded_count() const;

 private:
  size_t index_of(const std::string& id) const;

  const Loader load_;
  const bool load_on_demand_;
  std::vector<Model> models_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<DiffusionPipeline>> pipelines_;  // by index in models_; null: not loaded
};

}  // namespace kiln::serve
