#include "tokenizers/bpe_model.h"

#include <cstdio>
#include <functional>
#include <limits>
#include <queue>

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
  // Merges in rank order, leftmost first among equal ranks, as HF's word.merge_all: a heap of candidate pairs
  // over a linked list of symbols, so a long word costs O(n log n) rather than a rescan per merge (a 64 KB
  // word of letters took seconds). A symbol keeps its position when it absorbs its right neighbour, so
  // positions keep the word's order and "leftmost" is the lower position.
  const size_t n = symbols.size();
  if (n < 2) return symbols;
  std::vector<size_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;  // n: none
    prev[i] = i == 0 ? n : i - 1;
  }
  struct Candidate {
    int64_t rank;
    size_t pos;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto rank_at = [&](size_t i) -> const Merge* {
    if (i >= n || next[i] >= n) return nullptr;
    auto it = merges_.find(pair_key(symbols[i], symbols[next[i]]));
    return it == merges_.end() ? nullptr : &it->second;
  };
  const auto push = [&](size_t i) {
    if (const Merge* m = rank_at(i)) heap.push({m->rank, i});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const Merge* m = alive[c.pos] ? rank_at(c.pos) : nullptr;
    if (m == nullptr || m->rank != c.rank) continue;  // stale: a neighbour was merged away since
    const size_t right = next[c.pos];
    symbols[c.pos] = m->result;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] < n) prev[next[right]] = c.pos;
    if (prev[c.pos] < n) push(prev[c.pos]);
    push(c.pos);
  }
  std::vector<int64_t> merged;
  for (size_t i = 0; i < n; i = next[i]) merged.push_back(symbols[i]);
  return merged;
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
  // Long words are rare and would make the cache hold megabytes of keys.
  if (cache_.size() < kCacheCapacity && key.size() <= kMaxCachedWordBytes)
    cache_.emplace(key, std::move(merged));
}

}  // namespace kiln::tokenizers
