// What LoRA means for a model family, as its family descriptor declares it
// (kiln/pipelines/pipeline_registry.h): the components adapters load into, the layouts of LoRA files it
// takes, and its transformer's modules under their original names (Black Forest Labs' checkpoint layout,
// which kohya, ComfyUI, ai-toolkit and XLabs files follow) with the diffusers layers each one is. lora_keys.h
// converts a file's names with it; nothing in lora/ names a family.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kiln::lora {

enum class LoraFormat { Diffusers, Kohya, BlackForestLabs, XLabs };
// "diffusers (PEFT)", "kohya (sd-scripts)", "Black Forest Labs", "XLabs".
const char* format_name(LoraFormat format);

// One module of the original layout and the diffusers layers it is: a fused layer the model keeps apart
// (Black Forest Labs' qkv, FLUX.1's linear1) names several, in the order the adapter's up rows feed them.
struct OriginalModule {
  std::string name;  // relative to its block for block modules ("img_attn.qkv"), else the whole name
  std::vector<std::string> modules;
  // Black Forest Labs' final adaLN projection is (shift, scale), diffusers' norm_out.linear (scale, shift):
  // the adapter's up halves are swapped.
  bool swap_up_halves = false;
};

// One kind of block under its original name and diffusers' ("double_blocks.N.*" -> "transformer_blocks.N.*"),
// with its modules relative to the block.
struct OriginalBlocks {
  std::string original, diffusers;
  std::vector<OriginalModule> modules;
};

// A transformer's modules under their original names: its kinds of blocks (FLUX: double_blocks and
// single_blocks; Z-Image: layers, noise_refiner and context_refiner) and the rest.
struct OriginalLayout {
  std::vector<OriginalBlocks> blocks;
  std::vector<OriginalModule> top_level;
  bool empty() const { return blocks.empty() && top_level.empty(); }
  // The modules of the blocks named `original` (added, mapped to `diffusers`, when absent).
  std::vector<OriginalModule>& block(const std::string& original, const std::string& diffusers);
};

// FLUX's two kinds: double_blocks -> transformer_blocks, single_blocks -> single_transformer_blocks.
inline constexpr const char* kDoubleBlocks = "double_blocks";
inline constexpr const char* kSingleBlocks = "single_blocks";

// A kohya module of a denoiser the family names itself (LoraFamily::kohya_denoiser_module).
struct KohyaModule {
  std::string module;  // diffusers' module name in the denoiser
};

struct LoraFamily {
  std::string name;  // "FLUX.1", in messages
  // The components adapters load into (diffusers' _lora_loadable_modules, the prefixes of its layout) and
  // those fuse_lora fuses by default.
  std::vector<std::string> components, fuse_components;
  // The layouts it takes; the diffusers (PEFT) one always.
  std::vector<LoraFormat> formats = {LoraFormat::Diffusers};
  // The component kohya's lora_unet_ pairs and the original layout's modules load into ("transformer"; a
  // UNet's "unet").
  std::string denoiser = "transformer";
  // Its transformer's modules under their original names (kohya, Black Forest Labs and XLabs files).
  OriginalLayout original;
  // For a denoiser the family names itself rather than by `original`: a kohya lora_unet_ name without its
  // prefix ("down_blocks_0_attentions_0_proj_in") as the denoiser's diffusers module
  // ("down_blocks.0.attentions.0.proj_in"), nullopt for none of its modules. A pipeline may refine it from
  // its loaded config (DiffusionPipeline::lora_family).
  std::function<std::optional<KohyaModule>(const std::string& flat)> kohya_denoiser_module;
  // Whether kohya's lora_te1_ / lora_te_ and Black Forest Labs' text_encoders.clip_l pairs load into
  // text_encoder (a CLIP text model), as FLUX.1's do.
  bool clip_text_encoder = false;
  // Whether kohya's lora_te2_ pairs load into text_encoder_2 as a CLIP text model (SDXL's OpenCLIP bigG, in
  // transformers' CLIPTextModelWithProjection names) rather than being T5's, which diffusers skips (FLUX.1).
  bool clip_text_encoder_2 = false;
  // Whether a transformer pair whose down is narrower than its layer's input is padded with zeros, as
  // diffusers' FLUX loader does (_maybe_expand_lora_state_dict: XLabs' single-block proj_lora reads the
  // attention part of proj_out's input).
  bool pads_narrow_down = false;

  bool takes(LoraFormat format) const;
};

}  // namespace kiln::lora
