// SentencePiece Unigram segmentation as HF tokenizers runs it: Viterbi over the pieces that match at each
// character (scores summed in double), an <unk> node scored min_score - 10 for characters no single piece
// covers, consecutive unknowns fused, optional byte fallback (<0xNN> pieces).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
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

  // Appends the ids of the best segmentation of `text` (one pre-token) to `ids`.
  void encode(std::string_view text, std::vector<int64_t>& ids) const;
  std::vector<std::string> segment(std::string_view text) const;

  size_t size() const { return vocab_.size(); }
  const std::string& piece(int64_t id) const { return vocab_.at(static_cast<size_t>(id)).piece; }
  // -1 when absent.
  int64_t id_of(std::string_view piece) const;

 private:
  std::vector<Entry> vocab_;
  std::unordered_map<std::string, int64_t> ids_;
  std::unordered_set<std::string>
      prefixes_;  // every non-empty prefix of every piece, to stop trie walks early
  double min_score_;
  int64_t unk_id_;
  bool byte_fallback_;
};

}  // namespace kiln::tokenizers
