// Paged decode attention (paged_decode.cpp), for the layer's rows (layer_rows.cpp) to call.
#pragma once

#include "common.h"

at::Tensor paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor slot_mapping,
                        at::Tensor k_cache, at::Tensor v_cache,
                        at::Tensor block_tables, at::Tensor context_lens, double scale);
