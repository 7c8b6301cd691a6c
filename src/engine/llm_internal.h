// Internal access to an LLM's engine core, for code inside longctx that drives the core itself
// (the server's engine loop) instead of through generate(). Not part of the public API.
#pragma once

#include "engine/engine_core.h"
#include "longctx/llm.h"

namespace longctx {

// The core behind `llm`; whoever drives it must be its only user meanwhile (no generate()).
EngineCore& engine_core(LLM& llm);

}  // namespace longctx
