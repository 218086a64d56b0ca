// model: writes weights as a Hugging Face-style safetensors checkpoint — shards named
// model-00001-of-0000N.safetensors of at most `shard_bytes` each (a tensor is never split; one
// larger than that gets a shard of its own), model.safetensors.index.json mapping every tensor
// to its shard, and the model folder's config.json (and generation_config.json) beside them.
// For real-size loading runs without downloading a model (`lmserve model write-random`, issue
// #37): the weights of ModelWeights::dummy for a config, so that loading the checkpoint back
// gives exactly the dummy model's values. FP8 weights are not written (their scales would be
// other tensors).
#pragma once

#include <cstdint>
#include <filesystem>

#include "common/status.h"
#include "model/weights.h"

namespace lmserve::model {

struct CheckpointSummary {
  int shards = 0;
  std::uint64_t bytes = 0;  // tensor data, all shards
  int tensors = 0;
};

// Writes `weights` into `out_dir` (made if missing; files of the same names replaced), copying
// config.json and generation_config.json from `config_dir`.
Result<CheckpointSummary> write_checkpoint(const ModelWeights& weights, const std::filesystem::path& config_dir, const std::filesystem::path& out_dir,
                                           std::uint64_t shard_bytes);

}  // namespace lmserve::model
