// The UNet family's samplers: the folder's scheduler (scheduler/scheduler_config.json, whatever Kiln sampler
// it names), or the one a call names (`scheduler`, `use_karras_sigmas`), made from the folder's config as
// diffusers' SomeScheduler.from_config(pipe.scheduler.config, ...) swaps them, and set for the call's steps.
#pragma once

#include <memory>
#include <string>

#include "kiln/io/json_config.h"
#include "kiln/pipelines/pipeline_request.h"
#include "kiln/schedulers/discrete_schedule.h"

namespace kiln {

class UNetSamplers {
 public:
  // Reads `folder` (a diffusers scheduler/ component); throws kiln::Error naming the class when Kiln has no
  // such sampler.
  explicit UNetSamplers(const std::string& folder);
  // The folder's scheduler class ("PNDMScheduler").
  const std::string& class_name() const { return class_name_; }
  // Throws RequestError (field "scheduler") for a sampler name Kiln does not have, listing those it has.
  void check(const PipelineRequest& request) const;
  // The call's own sampler, set for `steps` steps.
  std::unique_ptr<DiscreteScheduler> for_call(const PipelineRequest& request, int steps) const;
  // SDXL's hand-off between expert denoisers, on a sampler set for the call: diffusers' discrete cutoff
  // int(round(T - fraction * T)) (T: num_train_timesteps). The step denoising_start starts from
  // (get_timesteps: the timesteps below the cutoff run, one more where a second-order sampler would cut a
  // step in two), and the step denoising_end stops before (the timesteps from `start` at or above its cutoff
  // run).
  static int denoising_start_step(const DiscreteScheduler& sampler, double denoising_start);
  static int denoising_end_step(const DiscreteScheduler& sampler, double denoising_end, int start);
  // A sampler's name as the image's metadata records it (the class, ", karras" with Karras sigmas).
  static std::string describe(const DiscreteScheduler& sampler);

 private:
  std::string folder_, class_name_;
  io::JsonConfig config_;  // the folder's scheduler_config.json, as its file has it
};

}  // namespace kiln
