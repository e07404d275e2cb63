#include "common/quant/iq1.h"

namespace mer {

// IQ1_S's 2048 grid points as the format defines them (ggml-common.h, iq1s_grid): byte i of an
// entry is element i's value as an int8, -1, 0 or 1.
const uint64_t kIQ1_SGrid[2048] = {
#include "common/quant/iq1_s_grid.inc"
};

}  // namespace mer
