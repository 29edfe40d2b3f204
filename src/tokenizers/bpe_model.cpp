#include "tokenizers/bpe_model.h"

#include <cstdio>
#include <limits>

#include "kiln/core/error.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {
uint64_t pair_key(int64_t a, int64_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
}
}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int64_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   std::string end_of_word_suffix, std::optional<int64_t> unk_id, const std::string& source,
                   BpeOptions options)
    : vocab_(std::move(vocab)), suffix_(std::move(end_of_word_suffix)), unk_id_(unk_id), options_(options) {
  for (const auto& [token, id] : vocab_) {
    KILN_CHECK(id >= 0 && id <= std::numeric_limits<uint32_t>::max(),
               source << ": token \"" << token << "\" has id " << id << ", expected 0..2^32-1");
  }
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int64_t ia = id_of(a), ib = id_of(b), ir = id_of(a + b);
    KILN_CHECK(ia >= 0 && ib >= 0 && ir >= 0, source << ": merge " << rank + 1 << " \"" << a << " " << b
                                                     << "\" uses a token missing from the vocabulary");
    // A pair listed twice keeps its last rank, as HF's merge map (collected into a hash map) does.
    merges_.insert_or_assign(pair_key(ia, ib), Merge{static_cast<int64_t>(rank), ir});
  }
}

int64_t BpeModel::id_of(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

std::vector<int64_t> BpeModel::merge_word(std::string_view word) const {
  std::vector<int64_t> symbols;
  if (options_.ignore_merges) {
    const int64_t whole = id_of(word);  // the word as it is, as HF looks it up
    if (whole >= 0) return {whole};
  }
  std::string unit;
  bool previous_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    const size_t start = pos;
    unicode::next_code_point(word, pos, "BPE model");
    unit.assign(word.substr(start, pos - start));
    if (pos == word.size()) unit += suffix_;
    const int64_t id = id_of(unit);
    if (id >= 0) {
      symbols.push_back(id);
      previous_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      std::vector<int64_t> bytes;
      for (size_t b = start; b < pos; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>",
                      static_cast<unsigned>(static_cast<unsigned char>(word[b])));
        const int64_t byte_id = id_of(name);
        if (byte_id < 0) break;
        bytes.push_back(byte_id);
      }
      if (bytes.size() == pos - start) {
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        previous_unk = false;
        continue;
      }
    }
    if (unk_id_ && !(options_.fuse_unk && previous_unk)) symbols.push_back(*unk_id_);
    previous_unk = unk_id_.has_value();
  }
  while (symbols.size() > 1) {
    int64_t best_rank = std::numeric_limits<int64_t>::max();
    size_t best_pos = 0;
    int64_t best_result = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merges_.find(pair_key(symbols[i], symbols[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best_pos = i;
        best_result = it->second.result;
      }
    }
    if (best_rank == std::numeric_limits<int64_t>::max()) break;
    symbols[best_pos] = best_result;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best_pos) + 1);
  }
  return symbols;
}

void BpeModel::encode(std::string_view word, std::vector<int64_t>& ids) const {
  if (word.empty()) return;
  const std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int64_t> merged = merge_word(word);
  ids.insert(ids.end(), merged.begin(), merged.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() < kCacheCapacity) cache_.emplace(key, std::move(merged));
}

}  // namespace kiln::tokenizers
