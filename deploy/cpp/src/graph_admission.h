// Which keys (input shapes, scalar values) hold CUDA graphs when more come than there are places: sightings counted
// per key and halved every `age_calls` calls; a key is captured on its second sighting into a free place, or into
// the place of the held key seen least if this key was seen more (a burst of new shapes cannot make call after call
// capture). Plain C++ outside the CUDA build, so the CPU tests check it (bindings.cpp's graph_admission).
#pragma once

#include "policy.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>

namespace jit2triton {

class Admission {
 public:
  explicit Admission(size_t max_graphs = policy::kMaxGraphs, int64_t age_calls = policy::kAgeCalls,
                     size_t max_seen = policy::kMaxSeen)
      : max_graphs_(max_graphs), age_calls_(age_calls), max_seen_(max_seen) {}

  void sighted(const std::string& key) {
    if (++calls_ >= age_calls_) {
      calls_ = 0;
      for (auto it = counts_.begin(); it != counts_.end();) {
        it->second /= 2;
        it = it->second == 0 ? counts_.erase(it) : std::next(it);
      }
    }
    if (!counts_.count(key) && counts_.size() >= max_seen_) {  // bounded: keys seen once go first
      for (auto it = counts_.begin(); it != counts_.end();) it = it->second <= 1 ? counts_.erase(it) : std::next(it);
      if (counts_.size() >= max_seen_) counts_.clear();
    }
    ++counts_[key];
  }

  // Whether to capture `key` (sighted, not held) now; once captured, make_room before storing it.
  template <typename Graphs>
  bool admit(const std::string& key, const Graphs& graphs) const {
    int64_t count = seen(key);
    return count >= 2 && (graphs.size() < max_graphs_ || seen(least(graphs)->first) < count);
  }

  // Drops the least-seen graph when every place is taken (after the capture, so a failed one evicts none).
  template <typename Graphs>
  void make_room(Graphs& graphs) const {
    if (graphs.size() >= max_graphs_) graphs.erase(least(graphs));
  }

 private:
  template <typename Graphs>
  auto least(Graphs& graphs) const {
    return std::min_element(graphs.begin(), graphs.end(),
                            [&](const auto& a, const auto& b) { return seen(a.first) < seen(b.first); });
  }

  int64_t seen(const std::string& key) const {
    auto it = counts_.find(key);
    return it == counts_.end() ? 0 : it->second;
  }

  size_t max_graphs_;
  int64_t age_calls_;
  size_t max_seen_;
  std::map<std::string, int64_t> counts_;
  int64_t calls_ = 0;
};

}  // namespace jit2triton
