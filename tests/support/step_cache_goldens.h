// What the step-cache tests share: a golden of tools/goldens/step_cache_*.py (diffusers' own hooks on a tiny
// pipeline), the per-evaluation decisions in the form both sides record, and the cached call with its
// latents checked against diffusers'. Each test keeps its own image bound (they differ by family).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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

// Each evaluation's counts of computed and reused attentions against the golden's per-attention record
// (`modules_computed` [evaluations, attentions] of 0 and 1), for PAB and FasterCache.
inline void expect_attentions_computed(const std::vector<nn::StepCache::Decision>& decisions,
                                       const GoldenFile& g) {
  const Tensor modules = g["modules_computed"];
  const std::vector<int64_t> ran = modules.to_vector<int64_t>();
  ASSERT_EQ(decisions.size(), static_cast<size_t>(modules.size(0))) << g.name;
  for (int64_t e = 0; e < modules.size(0); ++e) {
    int64_t computed = 0;
    for (int64_t m = 0; m < modules.size(1); ++m) computed += ran[e * modules.size(1) + m];
    EXPECT_EQ(decisions[e].attentions_computed, computed) << g.name << " evaluation " << e;
    EXPECT_EQ(decisions[e].attentions_reused, modules.size(1) - computed) << g.name << " evaluation " << e;
  }
}

// How far (relative max difference) the call without a cache ends from the cached call's final latents as
// diffusers recorded them: what shows a forecast is used. Printed.
inline double uncached_latents_distance(DiffusionPipeline& pipe, const StepCacheCase& g) {
  PipelineRequest uncached = g.request();
  uncached.cache = "none";
  Tensor last;
  uncached.callback_on_step_end = [&](StepState& s) { last = s.latents.contiguous(); };
  pipe(uncached);
  const std::vector<float> a = last.to(float32).to_vector<float>();
  const std::vector<float> e = g["latents_final"].to(float32).to_vector<float>();
  EXPECT_EQ(a.size(), e.size()) << g.name;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.size(), e.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - e[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(e[i])));
  }
  const double error = diff / scale;
  std::printf("[ uncached ] %s: latents %.3g from the cached call's (relative)\n", g.name.c_str(), error);
  return error;
}

}  // namespace kiln::testing
