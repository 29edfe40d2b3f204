// The form of POST /v1/images/edits (cli/serve/edit_form.h) and the images of JSON bodies: the parts read as
// a JSON body's fields, the images decoded, OpenAI's mask convention beside Kiln's, and every bad part
// refused with a RequestError naming the form field.
#include "cli/serve/edit_form.h"

#include <gtest/gtest.h>

#include "cli/serve/base64.h"
#include "kiln/core/limits.h"

namespace kiln::serve {
namespace {

// A PNG of `width` x `height` with `channels` channels, each pixel's values from `value(x, y, c)`.
template <class Value>
std::string png(int width, int height, int channels, Value value) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c) image.pixels.push_back(static_cast<uint8_t>(value(x, y, c)));
  return image.encode_png();
}

// The CRC-32 a PNG chunk ends with (ISO 3309, bit by bit).
uint32_t crc32_of(const std::string& bytes) {
  uint32_t crc = 0xffffffffu;
  for (const char b : bytes) {
    crc ^= static_cast<uint8_t>(b);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::string picture() {
  return png(8, 6, 3, [](int x, int y, int c) { return x * 30 + y * 7 + c; });
}

std::pair<std::string, std::string> refusal(const std::vector<FormPart>& parts) {
  try {
    parse_edit_form(parts);
  } catch (const RequestError& e) {
    return {e.field(), e.what()};
  }
  ADD_FAILURE() << "accepted";
  return {};
}

TEST(EditForm, ReadsTheImagesAndTheTextFieldsAsAJsonBodysFields) {
  const GenerationParams p = parse_edit_form({{"image", "in.png", "image/png", picture()},
                                              {"prompt", "", "", "a cat"},
                                              {"n", "", "", "2"},
                                              {"size", "", "", "16x32"},
                                              {"steps", "", "", "4"},
                                              {"strength", "", "", "0.25"},
                                              {"seed", "", "", "7"},
                                              {"negative_prompt", "", "", "12"},
                                              {"loras", "", "", R"([{"name": "style", "scale": 0.5}])"},
                                              {"response_format", "", "", "url"},
                                              {"model", "", "", "flux"}});
  ASSERT_EQ(p.request.image.size(), 1u);
  EXPECT_EQ(p.request.image[0].width, 8);
  EXPECT_EQ(p.request.image[0].height, 6);
  EXPECT_EQ(p.request.image[0].pixels[3 * 9 + 1], 30 + 7 + 1);  // (x 1, y 1), green
  EXPECT_EQ(p.request.prompt, "a cat");
  EXPECT_EQ(*p.request.negative_prompt, "12");  // a text field stays text, digits or not
  EXPECT_EQ(p.request.num_images_per_prompt, 2);
  EXPECT_EQ(*p.request.width, 16);
  EXPECT_EQ(*p.request.height, 32);
  EXPECT_EQ(*p.request.num_inference_steps, 4);
  EXPECT_DOUBLE_EQ(*p.request.strength, 0.25);
  EXPECT_EQ(*p.seed(), 7u);
  ASSERT_EQ(p.loras.size(), 1u);
  EXPECT_EQ(p.loras[0].name, "style");
  EXPECT_EQ(p.response_format, ResponseFormat::Url);
  EXPECT_EQ(p.model, "flux");
  EXPECT_FALSE(p.request.mask_image);
  // Several images, as the openai client names a list's parts.
  EXPECT_EQ(parse_edit_form(
                {{"image[]", "", "", picture()}, {"image[]", "", "", picture()}, {"prompt", "", "", "x"}})
                .request.image.size(),
            2u);
}

TEST(EditForm, ReadsOpenAIsMaskAndKilnsAlike) {
  // OpenAI's: transparent where the image is edited (here the right half).
  const std::string openai = png(8, 6, 4, [](int x, int, int c) { return c == 3 ? (x < 4 ? 255 : 0) : 90; });
  const GenerationParams a =
      parse_edit_form({{"image", "", "", picture()}, {"mask", "", "", openai}, {"prompt", "", "", "x"}});
  ASSERT_TRUE(a.request.mask_image);
  EXPECT_EQ(a.request.mask_image->channels, 1);
  EXPECT_EQ(a.request.mask_image->pixels[0], 0);    // opaque: kept (black)
  EXPECT_EQ(a.request.mask_image->pixels[7], 255);  // transparent: repainted (white)
  // Kiln's: white repaints, kept as it is; an opaque RGBA mask loses its alpha only.
  const std::string kiln = png(8, 6, 1, [](int x, int, int) { return x < 4 ? 0 : 255; });
  EXPECT_EQ(
      parse_edit_form({{"image", "", "", picture()}, {"mask_image", "", "", kiln}, {"prompt", "", "", "x"}})
          .request.mask_image->pixels,
      a.request.mask_image->pixels);
  const Image opaque = mask_from_upload(
      Image::decode_png(png(2, 1, 4, [](int x, int, int c) { return c == 3 ? 255 : x * 200; }), "mask", 100));
  EXPECT_EQ(opaque.channels, 3);
  EXPECT_EQ(opaque.pixels, (std::vector<uint8_t>{0, 0, 0, 200, 200, 200}));
}

TEST(EditForm, RefusesBadPartsNamingTheFormField) {
  const FormPart image{"image", "", "", picture()}, prompt{"prompt", "", "", "x"};
  EXPECT_EQ(refusal({prompt}).first, "image");
  EXPECT_EQ(refusal({image}).first, "prompt");
  EXPECT_EQ(refusal({image, prompt, {"image", "", "", "GIF89a"}}),
            (std::pair<std::string, std::string>{"image", "image: expected a PNG image: not a PNG file"}));
  EXPECT_EQ(refusal({image, prompt, {"mask", "", "", png(4, 4, 1, [](int, int, int) { return 0; })}}).second,
            "mask: 4x4, the image is 8x6 (the mask covers the first image, at its size)");
  EXPECT_EQ(refusal({image, prompt, {"mask", "", "", picture()}, {"mask", "", "", picture()}}).first, "mask");
  EXPECT_EQ(refusal({image, prompt, prompt}).second, "prompt: given twice");
  EXPECT_EQ(refusal({image, prompt, {"steps", "", "", "four"}}).first, "steps");
  EXPECT_EQ(refusal({image, prompt, {"steps", "", "", "0"}}).first, "steps");
  EXPECT_EQ(refusal({image, prompt, {"strength", "", "", "1.5"}}).first, "strength");
  EXPECT_EQ(refusal({image, prompt, {"colour", "", "", "red"}}).first, "colour");
  // A name with NULs (found by fuzz_serve_edit_form: the message began with one, so it read as empty) is
  // quoted in the message, whole.
  const FormPart odd{std::string("\0\0image", 7), "", "", "x"};
  EXPECT_EQ(refusal({image, prompt, odd, odd}).second, R"("\u0000\u0000image": given twice)");
  std::vector<FormPart> many(kMaxRequestImages + 1, image);
  many.push_back(prompt);
  EXPECT_EQ(refusal(many).first, "image");
  // An image whose header asks for more pixels than a request may carry is refused before it is decoded.
  const std::string huge = png(1, 1, 1, [](int, int, int) { return 0; });
  std::string wide = huge;
  wide[16] = 0x00, wide[17] = 0x00, wide[18] = 0x30, wide[19] = 0x00;  // IHDR width 12288
  wide[20] = 0x00, wide[21] = 0x00, wide[22] = 0x30, wide[23] = 0x00;  // height 12288
  const uint32_t crc = crc32_of(wide.substr(12, 17));                  // IHDR's type and data
  for (int i = 0; i < 4; ++i) wide[29 + i] = static_cast<char>(crc >> (24 - 8 * i));
  const auto [field, message] = refusal({{"image", "", "", wide}, prompt});
  EXPECT_EQ(field, "image");
  EXPECT_NE(message.find("12288x12288 pixels is more than"), std::string::npos) << message;
}

TEST(EditForm, JsonBodiesCarryImagesInBase64AndWriteThemBack) {
  const std::string body = R"({"prompt": "x", "image": ["data:image/png;base64,)" + base64_encode(picture()) +
                           R"("], "mask_image": ")" +
                           base64_encode(png(8, 6, 1, [](int x, int, int) { return x * 30; })) + R"("})";
  const GenerationParams p = parse_generation_params(body);
  ASSERT_EQ(p.request.image.size(), 1u);
  ASSERT_TRUE(p.request.mask_image);
  const GenerationParams again = parse_generation_params(to_json_text(p));
  EXPECT_EQ(again.request.image[0].pixels, p.request.image[0].pixels);
  EXPECT_EQ(again.request.mask_image->pixels, p.request.mask_image->pixels);
  // Left out of the parameters clients see.
  EXPECT_EQ(to_json_text(p, false).find("image"), std::string::npos);
  for (const char* bad :
       {R"({"prompt": "x", "image": 3})", R"({"prompt": "x", "image": "!!"})",
        R"({"prompt": "x", "image": "data:image/png,abc"})", R"({"prompt": "x", "image": "Zm9v"})"}) {
    try {
      parse_generation_params(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const RequestError& e) {
      EXPECT_EQ(e.field(), "image") << bad;
    }
  }
}

}  // namespace
}  // namespace kiln::serve
