// SentencePiece Unigram segmentation as HF tokenizers runs it: Viterbi over the pieces that match at each
// character (scores summed in double), an <unk> node scored min_score - 10 for characters no single piece
// covers, consecutive unknowns fused, optional byte fallback (<0xNN> pieces).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::tokenizers {

class UnigramModel {
 public:
  struct Entry {
    std::string piece;
    double score;
  };
  // `source` names the file for error messages.
  UnigramModel(std::vector<Entry> vocab, int64_t unk_id, bool byte_fallback, const std::string& source);
  // The lookup tables hold views of vocab_'s strings: moving keeps them valid, a copy would not.
  UnigramModel(const UnigramModel&) = delete;
  UnigramModel& operator=(const UnigramModel&) = delete;
  UnigramModel(UnigramModel&&) = default;

  // Appends the ids of the best segmentation of `text` (one pre-token) to `ids`.
  void encode(std::string_view text, std::vector<int64_t>& ids) const;
  std::vector<std::string> segment(std::string_view text) const;

  size_t size() const { return vocab_.size(); }
  const std::string& piece(int64_t id) const { return vocab_.at(static_cast<size_t>(id)).piece; }
  // -1 when absent.
  int64_t id_of(std::string_view piece) const;

 private:
  std::vector<Entry> vocab_;
  // Views of the pieces in vocab_ (so the table costs no copies).
  std::unordered_map<std::string_view, int64_t> ids_;
  // A byte trie of the pieces, walked from each position of the text; it grows with the vocabulary's total
  // size. (Every prefix as a string took L^2 / 2 bytes for a piece of L bytes: one 80 KB piece needed 3.2
  // GB.)
  static uint64_t child_key(uint64_t node, char byte) { return node << 8 | static_cast<unsigned char>(byte); }
  std::unordered_map<uint64_t, uint64_t> children_;
  std::vector<int64_t> piece_at_node_;  // the id of the piece ending at each node, or -1
  double min_score_;
  int64_t unk_id_;
  bool byte_fallback_;
};

}  // namespace kiln::tokenizers
