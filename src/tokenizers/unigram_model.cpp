#include "tokenizers/unigram_model.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "kiln/core/error.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {
constexpr double kUnknownPenalty = 10.0;
constexpr size_t kMaxPieceBytes = 1024;
}  // namespace

UnigramModel::UnigramModel(std::vector<Entry> vocab, int64_t unk_id, bool byte_fallback,
                           const std::string& source)
    : vocab_(std::move(vocab)), unk_id_(unk_id), byte_fallback_(byte_fallback) {
  KILN_CHECK(!vocab_.empty(), source << ": Unigram vocabulary is empty (at least <unk> is needed)");
  KILN_CHECK(unk_id_ >= 0 && unk_id_ < static_cast<int64_t>(vocab_.size()),
             source << ": Unigram unk_id " << unk_id_ << " is outside the vocabulary of " << vocab_.size());
  min_score_ = std::numeric_limits<double>::infinity();
  piece_at_node_.push_back(-1);  // the root
  for (size_t id = 0; id < vocab_.size(); ++id) {
    const std::string_view p = vocab_[id].piece;
    // Segmenting walks up to the longest piece's length from every position of the text, so one huge piece
    // would make every prompt cost its length times the piece's.
    KILN_CHECK(p.size() <= kMaxPieceBytes, source << ": Unigram piece " << id << " is " << p.size()
                                                  << " bytes, longer than the " << kMaxPieceBytes
                                                  << " a piece may have (SentencePiece's are a few dozen)");
    // A later duplicate wins, as in HF's token -> id map.
    ids_.insert_or_assign(p, static_cast<int64_t>(id));
    uint64_t node = 0;
    for (const char c : p) {
      auto [it, added] = children_.try_emplace(child_key(node, c), piece_at_node_.size());
      if (added) piece_at_node_.push_back(-1);
      node = it->second;
    }
    if (!p.empty()) piece_at_node_[node] = static_cast<int64_t>(id);
    min_score_ = std::min(min_score_, vocab_[id].score);
  }
}

int64_t UnigramModel::id_of(std::string_view piece) const {
  auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<std::string> UnigramModel::segment(std::string_view text) const {
  std::vector<std::string> result;
  if (text.empty()) return result;
  struct Best {
    int64_t id = 0;
    double score = 0.0;
    size_t start = std::numeric_limits<size_t>::max();  // max: not reached yet
  };
  const size_t n = text.size();
  const double unk_score = min_score_ - kUnknownPenalty;
  std::vector<Best> best(n + 1);
  for (size_t start = 0; start < n;) {
    const double base = best[start].score;
    const size_t char_len = unicode::utf8_length(static_cast<unsigned char>(text[start]));
    bool has_single = false;
    // Pieces starting here, shortest first, walking the trie one byte at a time.
    uint64_t node = 0;
    for (size_t end = start; end < n;) {
      auto child = children_.find(child_key(node, text[end++]));
      if (child == children_.end()) break;
      node = child->second;
      const int64_t id = piece_at_node_[node];
      if (id < 0) continue;
      const double candidate = base + vocab_[static_cast<size_t>(id)].score;
      Best& target = best[end];
      if (target.start == std::numeric_limits<size_t>::max() || candidate > target.score) {
        target = Best{id, candidate, start};
      }
      if (end - start == char_len) has_single = true;
    }
    if (!has_single) {
      Best& target = best[std::min(start + char_len, n)];
      const double candidate = base + unk_score;
      if (target.start == std::numeric_limits<size_t>::max() || candidate > target.score) {
        target = Best{unk_id_, candidate, start};
      }
    }
    start += char_len;
  }
  // Backtrack; runs of unknown pieces become one piece.
  std::string unknown;
  for (size_t end = n; end > 0;) {
    const Best& node = best[end];
    const std::string_view piece = text.substr(node.start, end - node.start);
    if (node.id == unk_id_) {
      unknown.insert(0, piece);
    } else {
      if (!unknown.empty()) {
        result.push_back(std::move(unknown));
        unknown.clear();
      }
      result.emplace_back(piece);
    }
    end = node.start;
  }
  if (!unknown.empty()) result.push_back(std::move(unknown));
  std::reverse(result.begin(), result.end());
  return result;
}

void UnigramModel::encode(std::string_view text, std::vector<int64_t>& ids) const {
  for (const std::string& piece : segment(text)) {
    const int64_t id = id_of(piece);
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> bytes;
      for (char c : piece) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned>(static_cast<unsigned char>(c)));
        const int64_t b = id_of(name);
        if (b < 0) break;
        bytes.push_back(b);
      }
      if (bytes.size() == piece.size()) {
        ids.insert(ids.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    ids.push_back(unk_id_);
  }
}

}  // namespace kiln::tokenizers
