// JsonConfig and the loaders for model_index.json, config.json, scheduler_config.json, tokenizer_config.json.
#include "kiln/io/json_config.h"

#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/io/component_config.h"
#include "kiln/io/model_index.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using io::JsonConfig;
using testing::data_path;
using testing::temp_dir;
using testing::write_text;

const char* kConfig = R"({
  "_class_name": "FluxTransformer2DModel",
  "num_layers": 19,
  "big": 9007199254740993,
  "ratio": 0.5,
  "guidance_embeds": true,
  "out_channels": null,
  "axes_dims_rope": [16, 56, 56],
  "scales": [1, 2.5],
  "names": ["a", "b"],
  "nested": {"inner": {"depth": 3}, "flag": false}
})";

TEST(JsonConfig, TypedAccess) {
  const JsonConfig c = JsonConfig::parse(kConfig, "cfg.json");
  EXPECT_EQ(c.get<std::string>("_class_name"), "FluxTransformer2DModel");
  EXPECT_EQ(c.get<int>("num_layers"), 19);
  EXPECT_EQ(c.get<int64_t>("big"), 9007199254740993);  // exact beyond double precision
  EXPECT_EQ(c.get<double>("ratio"), 0.5);
  EXPECT_EQ(c.get<float>("num_layers"), 19.0f);  // integers are numbers too
  EXPECT_TRUE(c.get<bool>("guidance_embeds"));
  EXPECT_EQ(c.get<std::vector<int64_t>>("axes_dims_rope"), (std::vector<int64_t>{16, 56, 56}));
  EXPECT_EQ(c.get<std::vector<double>>("scales"), (std::vector<double>{1, 2.5}));
  EXPECT_EQ(c.get<std::vector<std::string>>("names"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.get_or<int>("missing", 7), 7);
  EXPECT_EQ(c.get_or<int>("out_channels", 64), 64);  // null counts as absent
  EXPECT_EQ(c.get_or<int>("num_layers", 7), 19);
  EXPECT_EQ(c.get_optional<int>("out_channels"), std::nullopt);
  EXPECT_EQ(c.get_optional<int>("num_layers"), 19);
  EXPECT_TRUE(c.contains("out_channels"));
  EXPECT_FALSE(c.has("out_channels"));
  EXPECT_EQ(c.type_of("scales"), "array");
  EXPECT_EQ(c.type_of("nope"), "missing");
  EXPECT_EQ(c.keys().front(), "_class_name");  // file order
  EXPECT_EQ(c.keys().size(), 10u);
  const JsonConfig inner = c.object("nested").object("inner");
  EXPECT_EQ(inner.get<int>("depth"), 3);
  EXPECT_EQ(c.dump("axes_dims_rope"), "[16,56,56]");
}

TEST(JsonConfig, ErrorsNameTheFileKeyAndExpectedType) {
  const JsonConfig c = JsonConfig::parse(kConfig, "cfg.json");
  EXPECT_KILN_ERROR(c.get<int>("missing"), "cfg.json", "key 'missing'", "is missing", "expected an integer");
  EXPECT_KILN_ERROR(c.get<int>("ratio"), "cfg.json", "key 'ratio'", "expected an integer", "got number 0.5");
  EXPECT_KILN_ERROR(c.get<int>("big"), "key 'big'", "expected an integer (32-bit)");
  EXPECT_KILN_ERROR(c.get<std::string>("num_layers"), "key 'num_layers'", "expected a string");
  EXPECT_KILN_ERROR(c.get<bool>("out_channels"), "key 'out_channels'", "expected a boolean", "got null");
  EXPECT_KILN_ERROR(c.get<std::vector<int>>("scales"), "key 'scales'", "array of integers", "element 1");
  EXPECT_KILN_ERROR(c.get<std::vector<int>>("num_layers"), "key 'num_layers'", "array of integers");
  EXPECT_KILN_ERROR(c.get_or<int>("_class_name", 1), "key '_class_name'", "expected an integer");
  EXPECT_KILN_ERROR(c.object("nested").object("inner").get<std::string>("depth"), "cfg.json",
                    "key 'nested.inner.depth'");
  EXPECT_KILN_ERROR(c.object("num_layers"), "key 'num_layers'", "expected an object");
  EXPECT_KILN_ERROR(JsonConfig::parse("[1]", "arr.json"), "arr.json", "expected a JSON object", "array");
  EXPECT_KILN_ERROR(JsonConfig::parse("{\"a\": ", "trunc.json"), "trunc.json", "not valid JSON");
  EXPECT_KILN_ERROR(JsonConfig::load("/nonexistent/config.json"), "/nonexistent/config.json", "cannot read");
}

TEST(ModelIndex, LoadsTheTinyPipeline) {
  const io::ModelIndex index = io::load_model_index(data_path("models/tiny-dit"));
  EXPECT_EQ(index.class_name, "FluxPipeline");
  EXPECT_FALSE(index.diffusers_version.empty());
  const auto* t = index.find("transformer");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->library, "diffusers");
  EXPECT_EQ(t->class_name, "FluxTransformer2DModel");
  EXPECT_TRUE(t->present());
  ASSERT_NE(index.find("vae"), nullptr);
  EXPECT_FALSE(index.find("vae")->present());
  EXPECT_EQ(index.find("nothing"), nullptr);
  EXPECT_EQ(index.components.size(), 9u);
}

TEST(ModelIndex, OptionsNullsAndErrors) {
  const std::string dir = temp_dir("model_index");
  const std::string p = dir + "/model_index.json";
  write_text(p, R"({"_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.30.0",
    "force_zeros_for_empty_prompt": true, "image_encoder": null, "feature_extractor": [null, null],
    "text_encoder": ["transformers", "CLIPTextModelWithProjection"]})");
  const auto index = io::load_model_index(p);
  EXPECT_EQ(index.class_name, "StableDiffusion3Pipeline");
  ASSERT_EQ(index.components.size(), 3u);  // the boolean option is not a component
  EXPECT_FALSE(index.find("image_encoder")->present());
  EXPECT_FALSE(index.find("feature_extractor")->present());
  EXPECT_EQ(index.find("text_encoder")->library, "transformers");
  EXPECT_TRUE(index.raw.get<bool>("force_zeros_for_empty_prompt"));

  write_text(p, R"({"transformer": ["diffusers", "X"]})");
  EXPECT_KILN_ERROR(io::load_model_index(dir), "model_index.json", "key '_class_name'", "missing");
  write_text(p, R"({"_class_name": "P", "transformer": ["diffusers"]})");
  EXPECT_KILN_ERROR(io::load_model_index(dir), "model_index.json", "key 'transformer'", "[library, class]");
  write_text(p, R"({"_class_name": "P", "transformer": ["diffusers", 3]})");
  EXPECT_KILN_ERROR(io::load_model_index(dir), "key 'transformer'", "[library, class]");
  EXPECT_KILN_ERROR(io::load_model_index(temp_dir("model_index_none")), "model_index.json", "cannot read");
}

TEST(ComponentConfig, ModelAndSchedulerConfigs) {
  const auto model = io::load_model_config(data_path("models/tiny-dit/transformer"));
  EXPECT_EQ(model.class_name, "FluxTransformer2DModel");
  EXPECT_EQ(model.values.get<int>("num_layers"), 1);
  EXPECT_EQ(model.values.get<std::vector<int>>("axes_dims_rope"), (std::vector<int>{2, 2, 4}));
  EXPECT_FALSE(model.library_version.empty());
  const auto sched = io::load_scheduler_config(data_path("models/tiny-dit/scheduler/scheduler_config.json"));
  EXPECT_EQ(sched.class_name, "FlowMatchEulerDiscreteScheduler");
  EXPECT_EQ(sched.values.get<double>("shift"), 3.0);

  const std::string dir = temp_dir("component_config");
  write_text(dir + "/config.json", R"({"architectures": ["T5EncoderModel"], "transformers_version": "4.44.0",
    "d_model": 4096})");
  const auto t5 = io::load_model_config(dir);
  EXPECT_EQ(t5.class_name, "T5EncoderModel");
  EXPECT_EQ(t5.library_version, "4.44.0");
  write_text(dir + "/config.json", R"({"d_model": 4096})");
  EXPECT_KILN_ERROR(io::load_model_config(dir), "config.json", "_class_name", "architectures");
  write_text(dir + "/scheduler_config.json", R"({"shift": 1.0})");
  EXPECT_KILN_ERROR(io::load_scheduler_config(dir), "scheduler_config.json", "key '_class_name'", "missing");
}

TEST(ComponentConfig, TokenizerConfig) {
  const std::string dir = temp_dir("tokenizer_config");
  write_text(dir + "/tokenizer_config.json", R"({"tokenizer_class": "CLIPTokenizer", "model_max_length": 77,
    "bos_token": {"__type": "AddedToken", "content": "<|startoftext|>", "lstrip": false},
    "eos_token": "<|endoftext|>", "pad_token": null, "do_lower_case": true})");
  const auto clip = io::load_tokenizer_config(dir);
  EXPECT_EQ(clip.class_name, "CLIPTokenizer");
  EXPECT_EQ(clip.model_max_length, 77);
  EXPECT_EQ(clip.special_tokens.at("bos_token"), "<|startoftext|>");
  EXPECT_EQ(clip.special_tokens.at("eos_token"), "<|endoftext|>");
  EXPECT_EQ(clip.special_tokens.count("pad_token"), 0u);
  EXPECT_TRUE(clip.values.get<bool>("do_lower_case"));
  // transformers writes this number for "no limit".
  write_text(dir + "/tokenizer_config.json", R"({"tokenizer_class": "T5TokenizerFast",
    "model_max_length": 1000000000000000019884624838656, "unk_token": "<unk>"})");
  const auto t5 = io::load_tokenizer_config(dir + "/tokenizer_config.json");
  EXPECT_EQ(t5.model_max_length, std::nullopt);
  EXPECT_EQ(t5.special_tokens.at("unk_token"), "<unk>");
  write_text(dir + "/tokenizer_config.json", R"({"model_max_length": "77"})");
  EXPECT_KILN_ERROR(io::load_tokenizer_config(dir), "tokenizer_config.json", "key 'model_max_length'");
  write_text(dir + "/tokenizer_config.json", R"({"eos_token": {"lstrip": true}})");
  EXPECT_KILN_ERROR(io::load_tokenizer_config(dir), "key 'eos_token.content'", "missing");
}

}  // namespace
}  // namespace kiln
