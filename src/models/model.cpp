#include "longctx/models/model.h"

#include <cmath>

namespace longctx {

float Model::attention_scale() const {
  return 1.0f / std::sqrt(static_cast<float>(config().head_dim));
}

}  // namespace longctx
