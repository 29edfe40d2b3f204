// BpeModel merges with a heap (O(n log n) in the word's length); its result must be exactly that of the
// definition, rescanning for the lowest-ranked pair, leftmost first, after every merge.
#include "tokenizers/bpe_model.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <random>

namespace kiln::tokenizers {
namespace {

// Symbols "a".."d" (the last one of a word with "</w>"), and merges of every pair of known tokens found while
// building, in a shuffled order, so that ranks, ties and chains of merges all occur.
struct Fixture {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;

  Fixture() {
    std::vector<std::string> tokens;
    for (const char* c : {"a", "b", "c", "d"}) {
      tokens.push_back(c);
      tokens.push_back(std::string(c) + "</w>");
    }
    std::mt19937 rng(7);
    for (int i = 0; i < 60; ++i) {
      const std::string& x = tokens[rng() % tokens.size()];
      const std::string& y = tokens[rng() % tokens.size()];
      if (x.find("</w>") != std::string::npos) continue;  // only a word's last symbol carries the suffix
      merges.emplace_back(x, y);
      tokens.push_back(x + y);
    }
    for (const auto& t : tokens) vocab.emplace(t, static_cast<int64_t>(vocab.size()));
  }

  // The definition: rescan after every merge.
  std::vector<int64_t> reference(const std::string& word) const {
    std::vector<std::string> symbols;
    for (size_t i = 0; i < word.size(); ++i)
      symbols.push_back(word.substr(i, 1) + (i + 1 == word.size() ? "</w>" : ""));
    std::map<std::pair<std::string, std::string>, size_t> rank;
    for (size_t r = 0; r < merges.size(); ++r) rank[merges[r]] = r;  // a repeated pair keeps its last rank
    for (;;) {
      size_t best = std::numeric_limits<size_t>::max(), at = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = rank.find({symbols[i], symbols[i + 1]});
        if (it != rank.end() && it->second < best) best = it->second, at = i;
      }
      if (best == std::numeric_limits<size_t>::max()) break;
      symbols[at] += symbols[at + 1];
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    std::vector<int64_t> ids;
    for (const auto& s : symbols) ids.push_back(vocab.at(s));
    return ids;
  }
};

TEST(BpeModel, HeapMergeEqualsTheDefinition) {
  const Fixture f;
  const BpeModel model(f.vocab, f.merges, "</w>", std::nullopt, "test");
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    std::string word;
    const size_t length = 1 + rng() % 40;
    for (size_t i = 0; i < length; ++i) word += static_cast<char>('a' + rng() % 4);
    std::vector<int64_t> ids;
    model.encode(word, ids);
    ASSERT_EQ(ids, f.reference(word)) << word;
  }
}

TEST(BpeModel, LongWordsMergeLikeShortOnes) {
  const Fixture f;
  const BpeModel model(f.vocab, f.merges, "</w>", std::nullopt, "test");
  std::string word;
  for (int i = 0; i < 3000; ++i) word += "abcdab"[i % 6];
  std::vector<int64_t> ids;
  model.encode(word, ids);
  EXPECT_EQ(ids, f.reference(word));
}

}  // namespace
}  // namespace kiln::tokenizers
