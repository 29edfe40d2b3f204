// The FLUX.2 text encoders built from the REAL configs (FLUX.2-dev's Mistral Small 3.2, klein 4B's Qwen3-4B,
// klein 9B's Qwen3-8B) have exactly the tensor names and shapes of transformers' classes (recorded on the
// meta device by tools/goldens/flux2_text_real_layouts.py), and load strictly from them in every checkpoint
// naming. Registering parameters allocates nothing and the layout source broadcasts one element, so the 24B
// model costs no memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux2_prompt_encoder.h"
#include "support/layout_source.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const nlohmann::json& layouts() {
  static const nlohmann::json j = [] {
    std::ifstream in(testing::data_path("goldens/flux2_text/real_layouts.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

models::DecoderTextEncoderConfig config_of(const std::string& component) {
  const std::string path = testing::temp_dir("flux2_real_config_" + component) + "/config.json";
  std::ofstream(path) << layouts()["configs"][component].dump();
  return models::DecoderTextEncoderConfig::from_file(path);
}

using testing::LayoutSource;

std::string identity(const std::string& n) {
  return n;
}
// save_pretrained's names for Mistral3ForConditionalGeneration (the original checkpoint format).
std::string saved_mistral3_name(const std::string& n) {
  if (n.rfind("model.language_model.", 0) == 0) return "language_model.model." + n.substr(21);
  if (n == "lm_head.weight") return "language_model.lm_head.weight";
  if (n.rfind("model.", 0) == 0) return n.substr(6);
  return n;
}

// The text model's own tensors: the full model built from the real config has exactly these names.
void expect_same_text_layout(nn::Module& model, const nlohmann::json& layout, const std::string& prefix) {
  std::set<std::string> mine, want;
  for (const auto& entry : model.named_parameters()) mine.insert(prefix + entry.first);
  for (auto& [name, shape] : layout.items()) {
    if (name.rfind(prefix, 0) == 0) want.insert(name);
  }
  std::vector<std::string> missing, extra;
  std::set_difference(want.begin(), want.end(), mine.begin(), mine.end(), std::back_inserter(missing));
  std::set_difference(mine.begin(), mine.end(), want.begin(), want.end(), std::back_inserter(extra));
  EXPECT_TRUE(missing.empty()) << missing.size() << " real tensors not in the model, e.g. "
                               << missing.front();
  EXPECT_TRUE(extra.empty()) << extra.size() << " model parameters not in the real checkpoint, e.g. "
                             << extra.front();
}

struct Component {
  const char* name;
  const char* prefix;  // of the text model's tensors in the module tree
  int64_t language_model_parameters;
};

const Component kComponents[] = {
    {"flux2_dev_text_encoder", "model.language_model.", 22901314560},
    {"klein_4b_text_encoder", "model.", 4022468096},
    {"klein_9b_text_encoder", "model.", 7568405504},
};

TEST(Flux2TextRealLayouts, FullModelsHaveTheRealNamesAndShapes) {
  for (const auto& c : kComponents) {
    const auto config = config_of(c.name);
    models::DecoderTextEncoder model(config, -1, true);
    expect_same_text_layout(model, layouts()["layouts"][c.name], c.prefix);
    EXPECT_EQ(model.num_parameters(), c.language_model_parameters) << c.name;
    EXPECT_EQ(model.num_parameters(), layouts()["parameters"][c.name]["language_model"].get<int64_t>())
        << c.name;
    // Every layer and the final norm, loaded strictly (each registered shape checked).
    EXPECT_NO_THROW(models::load_decoder_text_encoder(
        config, LayoutSource(layouts()["layouts"][c.name], identity), bfloat16, {config.num_hidden_layers}))
        << c.name;
  }
}

TEST(Flux2TextRealLayouts, MistralLoadsInBothCheckpointNamings) {
  const auto config = config_of("flux2_dev_text_encoder");
  for (auto rename : {identity, saved_mistral3_name}) {
    const LayoutSource source(layouts()["layouts"]["flux2_dev_text_encoder"], rename);
    auto model = models::load_decoder_text_encoder(config, source, bfloat16, {10, 20, 30});
    EXPECT_EQ(model->num_layers_built(), 30);
  }
}

// What the pipelines load (their default layers): the embedding and the layers up to the deepest one, no
// final norm (counted independently from the layouts by summing the shapes of embed_tokens and layers
// 0..N-1): 32.3 GiB of bf16 weights for FLUX.2-dev (of 42.7 GiB for the whole language model), 5.80 GiB for
// klein 4B, 10.86 GiB for 9B.
TEST(Flux2TextRealLayouts, PipelineLayersAndTheirBfloat16Memory) {
  struct Expect {
    const char* name;
    models::DecoderFamily family;
    int64_t layers_built;
    int64_t parameters;
  };
  for (const Expect& e : {Expect{"flux2_dev_text_encoder", models::DecoderFamily::Mistral, 30, 17343754240},
                          Expect{"klein_4b_text_encoder", models::DecoderFamily::Qwen3, 27, 3114088192},
                          Expect{"klein_9b_text_encoder", models::DecoderFamily::Qwen3, 27, 5831883520}}) {
    const auto config = config_of(e.name);
    EXPECT_EQ(config.family, e.family);
    auto model =
        models::load_decoder_text_encoder(config, LayoutSource(layouts()["layouts"][e.name], identity),
                                          bfloat16, Flux2PromptEncoder::default_layers(e.family));
    EXPECT_EQ(model->num_layers_built(), e.layers_built) << e.name;
    EXPECT_EQ(model->num_parameters(), e.parameters)
        << e.name << ": " << 2.0 * model->num_parameters() / (1 << 30) << " GiB in bf16";
  }
}

}  // namespace
}  // namespace kiln
