// The compiled-forward cache a compiled Module (or a family of repeated blocks) holds: one traced program per
// input signature (graph/program.h), counters and KILN_LOG=compile explanations.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "graph/program.h"
#include "kiln/nn/compile.h"

namespace kiln::nn {

class CompiledForward {
 public:
  CompiledForward(CompileOptions options, std::string name);

  // Runs `eager` compiled: the program for these inputs' shapes and dtypes (and `params`', and `extra_key`)
  // is traced and built on first use, then reused.
  std::vector<Tensor> call(const std::vector<Tensor>& inputs, const std::vector<Tensor>& params,
                           const graph::Program::Forward& eager, const std::string& extra_key);

  size_t program_count() const;

 private:
  CompileOptions options_;
  std::string name_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<graph::Program>> programs_;
  std::set<std::string> eager_keys_;  // signatures whose forward broke the graph (fullgraph = false)
};

}  // namespace kiln::nn
