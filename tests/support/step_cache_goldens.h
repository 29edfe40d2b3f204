// What the step-cache tests share: a golden of tools/goldens/step_cache_*.py (diffusers' own hooks on a tiny
// pipeline), the per-evaluation decisions in the form both sides record, and the cached call with its
// latents checked against diffusers'. Each test keeps its own image bound (they differ by family).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/step_cache.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "support/pipeline_comparison.h"

namespace kiln::testing {

// A golden of tests/data/goldens/<folder>/: the call in its metadata, the cache as Kiln's spec (`cache`).
struct StepCacheCase : GoldenFile {
  StepCacheCase(const std::string& folder, const std::string& name) : GoldenFile(folder, name) {}
  bool bf16() const { return meta("dtype") == "bfloat16"; }
  PipelineRequest cached_request() const {
    PipelineRequest r = request();
    r.cache = meta("cache");
    return r;
  }
};

// Per evaluation: context (0 cond, 1 uncond) and whether the cache computed.
using Decisions = std::vector<std::pair<int64_t, int64_t>>;

inline Decisions decisions_of(const nn::StepCache& cache) {
  Decisions out;
  for (const nn::StepCache::Decision& d : cache.decisions())
    out.emplace_back(d.context == "cond" ? 0 : 1, d.computed ? 1 : 0);
  return out;
}

inline Decisions golden_decisions(const StepCacheCase& g) {
  const std::vector<int64_t> context = g["context"].to_vector<int64_t>();
  const std::vector<int64_t> computed = g["computed"].to_vector<int64_t>();
  Decisions out;
  for (size_t i = 0; i < context.size(); ++i) out.emplace_back(context[i], computed[i]);
  return out;
}

// The cond steps (from 1) the golden did not compute, as the image's text `cache_reused` begins: "3,5,6".
inline std::string golden_reused_steps(const StepCacheCase& g) {
  std::string reused;
  int step = 0;
  for (const auto& [context, computed] : golden_decisions(g)) {
    if (context != 0) continue;
    ++step;
    if (!computed) reused += (reused.empty() ? "" : ",") + std::to_string(step);
  }
  return reused;
}

// The call with the golden's cache; the latents after the first and the last step within `tolerance`
// (relative) of diffusers'.
inline PipelineOutput run_checking_latents(DiffusionPipeline& pipe, const StepCacheCase& g,
                                           double tolerance) {
  PipelineRequest request = g.cached_request();
  std::vector<Tensor> steps;
  request.callback_on_step_end = [&](StepState& s) { steps.push_back(s.latents.contiguous()); };
  PipelineOutput out = pipe(request);
  EXPECT_EQ(static_cast<int>(steps.size()), std::stoi(g.meta("steps_run"))) << g.name;
  if (!steps.empty()) {
    EXPECT_TRUE(rel_max_error_within(steps.front(), g["latents_step0"], tolerance)) << g.name;
    EXPECT_TRUE(rel_max_error_within(steps.back(), g["latents_final"], tolerance)) << g.name;
  }
  return out;
}

}  // namespace kiln::testing
