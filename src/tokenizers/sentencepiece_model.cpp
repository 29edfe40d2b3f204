#include "tokenizers/sentencepiece_model.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln::tokenizers {
namespace {

// Protobuf wire types.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

class WireReader {
 public:
  WireReader(std::string_view data, const std::string& source, const char* message)
      : data_(data), source_(source), message_(message) {}

  bool done() const { return pos_ >= data_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      KILN_CHECK(pos_ < data_.size(), source_ << ": truncated varint in " << message_ << " at byte " << pos_
                                              << " (corrupt or not a SentencePiece model)");
      const auto b = static_cast<unsigned char>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    KILN_FAIL(source_ << ": varint longer than 10 bytes in " << message_ << " (corrupt SentencePiece model)");
  }

  // Reads a field key; returns false at the end of the message.
  bool next(uint32_t& field, uint32_t& wire) {
    if (done()) return false;
    const uint64_t key = varint();
    field = static_cast<uint32_t>(key >> 3);
    wire = static_cast<uint32_t>(key & 7);
    KILN_CHECK(field != 0, source_ << ": field number 0 in " << message_ << " (corrupt SentencePiece model)");
    return true;
  }

  std::string_view bytes() {
    const uint64_t len = varint();
    KILN_CHECK(len <= data_.size() - pos_, source_ << ": " << message_ << " field of " << len
                                                   << " bytes at byte " << pos_ << " runs past the end ("
                                                   << data_.size() - pos_
                                                   << " bytes left; file truncated or corrupt)");
    std::string_view r = data_.substr(pos_, len);
    pos_ += len;
    return r;
  }

  float fixed32_float() {
    KILN_CHECK(data_.size() - pos_ >= 4, source_ << ": truncated float in " << message_);
    float f;
    std::memcpy(&f, data_.data() + pos_, 4);
    pos_ += 4;
    return f;
  }

  void skip(uint32_t wire) {
    switch (wire) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        KILN_CHECK(data_.size() - pos_ >= 8, source_ << ": truncated fixed64 in " << message_);
        pos_ += 8;
        return;
      case kLengthDelimited:
        bytes();
        return;
      case kFixed32:
        KILN_CHECK(data_.size() - pos_ >= 4, source_ << ": truncated fixed32 in " << message_);
        pos_ += 4;
        return;
      default:
        KILN_FAIL(source_ << ": unsupported protobuf wire type " << wire << " in " << message_
                          << " (corrupt or not a SentencePiece model)");
    }
  }

  void expect(uint32_t wire, uint32_t expected, uint32_t field) {
    KILN_CHECK(wire == expected, source_ << ": " << message_ << " field " << field << " has wire type "
                                         << wire << ", expected " << expected
                                         << " (corrupt or not a SentencePiece model)");
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  const std::string& source_;
  const char* message_;
};

int32_t as_int32(uint64_t v) {
  return static_cast<int32_t>(static_cast<uint32_t>(v));
}

SentencePieceModel::Piece parse_piece(std::string_view data, const std::string& source) {
  SentencePieceModel::Piece p;
  WireReader r(data, source, "SentencePiece");
  uint32_t field, wire;
  bool has_piece = false;
  while (r.next(field, wire)) {
    if (field == 1) {
      r.expect(wire, kLengthDelimited, field);
      p.piece = std::string(r.bytes());
      has_piece = true;
    } else if (field == 2) {
      r.expect(wire, kFixed32, field);
      p.score = r.fixed32_float();
    } else if (field == 3) {
      r.expect(wire, kVarint, field);
      const int32_t t = as_int32(r.varint());
      KILN_CHECK(t >= 1 && t <= 6, source << ": piece type " << t << " is not a SentencePiece::Type (1..6)");
      p.type = static_cast<SentencePieceModel::PieceType>(t);
    } else {
      r.skip(wire);
    }
  }
  KILN_CHECK(has_piece, source << ": a SentencePiece entry has no piece string (corrupt model)");
  return p;
}

void parse_trainer_spec(std::string_view data, const std::string& source, SentencePieceModel& m) {
  WireReader r(data, source, "TrainerSpec");
  uint32_t field, wire;
  while (r.next(field, wire)) {
    switch (field) {
      case 3:
        r.expect(wire, kVarint, field);
        m.model_type = as_int32(r.varint());
        break;
      case 35:
        r.expect(wire, kVarint, field);
        m.byte_fallback = r.varint() != 0;
        break;
      case 40:
        r.expect(wire, kVarint, field);
        m.unk_id = as_int32(r.varint());
        break;
      case 41:
        r.expect(wire, kVarint, field);
        m.bos_id = as_int32(r.varint());
        break;
      case 42:
        r.expect(wire, kVarint, field);
        m.eos_id = as_int32(r.varint());
        break;
      case 43:
        r.expect(wire, kVarint, field);
        m.pad_id = as_int32(r.varint());
        break;
      default:
        r.skip(wire);
    }
  }
}

void parse_normalizer_spec(std::string_view data, const std::string& source, SentencePieceModel& m) {
  WireReader r(data, source, "NormalizerSpec");
  uint32_t field, wire;
  while (r.next(field, wire)) {
    switch (field) {
      case 1:
        r.expect(wire, kLengthDelimited, field);
        m.normalizer_name = std::string(r.bytes());
        break;
      case 2:
        r.expect(wire, kLengthDelimited, field);
        m.precompiled_charsmap = std::string(r.bytes());
        break;
      case 3:
        r.expect(wire, kVarint, field);
        m.add_dummy_prefix = r.varint() != 0;
        break;
      case 4:
        r.expect(wire, kVarint, field);
        m.remove_extra_whitespaces = r.varint() != 0;
        break;
      case 5:
        r.expect(wire, kVarint, field);
        m.escape_whitespaces = r.varint() != 0;
        break;
      default:
        r.skip(wire);
    }
  }
}

}  // namespace

SentencePieceModel SentencePieceModel::parse(std::string_view bytes, const std::string& source) {
  SentencePieceModel m;
  WireReader r(bytes, source, "ModelProto");
  uint32_t field, wire;
  while (r.next(field, wire)) {
    if (field == 1) {
      r.expect(wire, kLengthDelimited, field);
      m.pieces.push_back(parse_piece(r.bytes(), source));
    } else if (field == 2) {
      r.expect(wire, kLengthDelimited, field);
      parse_trainer_spec(r.bytes(), source, m);
    } else if (field == 3) {
      r.expect(wire, kLengthDelimited, field);
      parse_normalizer_spec(r.bytes(), source, m);
    } else {
      r.skip(wire);
    }
  }
  KILN_CHECK(!m.pieces.empty(),
             source << ": SentencePiece model has no pieces (empty, corrupt or not a model file)");
  const auto n = static_cast<int32_t>(m.pieces.size());
  KILN_CHECK(m.unk_id >= 0 && m.unk_id < n,
             source << ": unk_id " << m.unk_id << " is outside the " << n << " pieces of the model");
  return m;
}

SentencePieceModel SentencePieceModel::load(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f, path.string() << ": cannot open SentencePiece model");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path.string());
}

}  // namespace kiln::tokenizers
