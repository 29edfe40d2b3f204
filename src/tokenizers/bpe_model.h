// Byte-pair-encoding model (HF tokenizers' BPE without dropout): a word starts as its characters, the last
// one carrying the end-of-word suffix (CLIP's "</w>"), and the adjacent pair with the lowest merge rank is
// merged (leftmost first on ties) until no listed merge applies. Results are cached per word.
// A character missing from the vocabulary becomes its <0xHH> byte tokens (byte_fallback, when they all
// exist), else the unk token (consecutive ones fused into one with fuse_unk), else nothing, as in HF. With
// ignore_merges (Tekken, Llama 3) a word that is itself in the vocabulary is that one token.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::tokenizers {

struct BpeOptions {
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
};

class BpeModel {
 public:
  // `source` names the files for error messages. Every merge and its result must be in the vocabulary.
  BpeModel(std::unordered_map<std::string, int64_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, std::string end_of_word_suffix,
           std::optional<int64_t> unk_id, const std::string& source, BpeOptions options = {});

  // Appends the ids of one pre-token to `ids`.
  void encode(std::string_view word, std::vector<int64_t>& ids) const;

  size_t vocab_size() const { return vocab_.size(); }
  // -1 when absent.
  int64_t id_of(std::string_view token) const;

 private:
  std::vector<int64_t> merge_word(std::string_view word) const;

  std::unordered_map<std::string, int64_t> vocab_;
  struct Merge {
    int64_t rank;
    int64_t result;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // key: (left id << 32) | right id
  std::string suffix_;
  std::optional<int64_t> unk_id_;
  BpeOptions options_;

  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace kiln::tokenizers
