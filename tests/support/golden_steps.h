// The transformer's inputs at the first denoising step of a golden run (tools/goldens/flux.py, sd3.py), as
// the pipelines pass them, with diffusers' output for that step. Shared by the transformer and execution-mode
// tests.
#pragma once

#include <string>

#include "kiln/io/safetensors.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/ops/layout.h"
#include "support/test_data.h"

namespace kiln::testing {

struct FluxStepInputs {
  Tensor hidden, encoder_hidden, pooled, timestep, guidance, txt_ids, img_ids, expected;
  std::string pipeline;  // the folder under tests/data/models
};

inline FluxStepInputs flux_step0_inputs(const std::string& golden) {
  io::SafetensorsFile g(data_path("goldens/flux/" + golden + ".safetensors"));
  FluxStepInputs in;
  in.pipeline = g.metadata().at("pipeline");
  in.hidden = g.tensor("latents_init");
  in.encoder_hidden = g.tensor("prompt_embeds");
  in.pooled = g.tensor("pooled_prompt_embeds");
  in.timestep = g.tensor("transformer_in_timestep");
  if (g.contains("transformer_in_guidance")) in.guidance = g.tensor("transformer_in_guidance");
  in.expected = g.tensor("transformer_out_step0");
  // FluxPipeline: the latent grid is 2 * floor(H / 16) high; packing halves it; ids in the prompt's dtype.
  const int64_t height = std::stoll(g.metadata().at("height")), width = std::stoll(g.metadata().at("width"));
  in.img_ids = models::flux_latent_image_ids(height / 16, width / 16, in.encoder_hidden.dtype());
  in.txt_ids = models::flux_text_ids(in.encoder_hidden.size(1), in.encoder_hidden.dtype());
  return in;
}

struct Sd3StepInputs {
  Tensor hidden, encoder_hidden, pooled, timestep, expected;
  std::string pipeline;
};

// With classifier-free guidance the batch is [negative; positive], as StableDiffusion3Pipeline builds it.
inline Sd3StepInputs sd3_step0_inputs(const std::string& name) {
  io::SafetensorsFile g(data_path("goldens/sd3/" + name + ".safetensors"));
  Sd3StepInputs in;
  in.pipeline = g.metadata().at("pipeline");
  in.hidden = g.tensor("latents_init");
  in.encoder_hidden = g.tensor("prompt_embeds");
  in.pooled = g.tensor("pooled_prompt_embeds");
  if (g.metadata().at("cfg") == "true") {
    in.hidden = concat({in.hidden, in.hidden}, 0);
    in.encoder_hidden = concat({g.tensor("negative_prompt_embeds"), in.encoder_hidden}, 0);
    in.pooled = concat({g.tensor("negative_pooled_prompt_embeds"), in.pooled}, 0);
  }
  in.timestep = g.tensor("transformer_in_timestep");
  in.expected = g.tensor("transformer_out_step0");
  return in;
}

// FLUX.2 (tools/goldens/flux2.py): the first transformer call of a pipeline run, as the pipeline made it (the
// reference images' latents appended to the noise; ids as diffusers passed them, batch row 0).
struct Flux2StepInputs {
  Tensor hidden, encoder_hidden, timestep, guidance, txt_ids, img_ids, expected;
  std::string pipeline;
};

inline Flux2StepInputs flux2_step0_inputs(const std::string& golden) {
  io::SafetensorsFile g(data_path("goldens/flux2/" + golden + ".safetensors"));
  Flux2StepInputs in;
  in.pipeline = g.metadata().at("pipeline");
  in.hidden = g.tensor("transformer_in_hidden");
  const Tensor embeds = g.tensor("prompt_embeds");
  in.encoder_hidden = embeds.expand({in.hidden.size(0), embeds.size(1), embeds.size(2)}).contiguous();
  in.timestep = g.tensor("transformer_in_timestep");
  if (g.contains("transformer_in_guidance")) in.guidance = g.tensor("transformer_in_guidance");
  in.txt_ids = g.tensor("transformer_in_txt_ids").select(0, 0);
  in.img_ids = g.tensor("transformer_in_img_ids").select(0, 0);
  in.expected = g.tensor("transformer_out_step0");
  return in;
}

}  // namespace kiln::testing
