// Reader for SentencePiece model files (spiece.model): the serialized sentencepiece.ModelProto, decoded with
// a minimal protobuf wire-format parser that keeps only the fields a Unigram tokenizer needs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::tokenizers {

struct SentencePieceModel {
  // SentencePiece::Type in sentencepiece_model.proto.
  enum class PieceType : int32_t {
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6
  };
  struct Piece {
    std::string piece;
    float score = 0.0f;
    PieceType type = PieceType::Normal;
  };
  std::vector<Piece> pieces;

  // TrainerSpec (defaults are the proto's).
  int32_t model_type = 1;  // 1 = UNIGRAM, 2 = BPE, 3 = WORD, 4 = CHAR
  int32_t unk_id = 0;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t pad_id = -1;
  bool byte_fallback = false;

  // NormalizerSpec.
  std::string normalizer_name;
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;

  static SentencePieceModel parse(std::string_view bytes, const std::string& source);
  static SentencePieceModel load(const std::filesystem::path& path);
};

}  // namespace kiln::tokenizers
