#include "longctx/models/model.h"

#include <cmath>

namespace longctx {

float Model::attention_scale() const {
  const ModelConfig& c = config();
  const double d = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(c.head_dim);
  return static_cast<float>(1.0 / std::sqrt(d));
}

}  // namespace longctx
