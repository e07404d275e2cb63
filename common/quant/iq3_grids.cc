#include "common/quant/iq3.h"

namespace mer {

// IQ3_XXS's 256 grid points as the format defines them (ggml-common.h, iq3xxs_grid): byte i of an
// entry is element i's magnitude code, one of 4, 12, 20, 28, 36, 44, 52, 62.
const uint32_t kIQ3_XXSGrid[256] = {
#include "common/quant/iq3_xxs_grid.inc"
};

// IQ3_S's 512 grid points as the format defines them (ggml-common.h, iq3s_grid): byte i of an
// entry is element i's magnitude code, an odd number from 1 to 15.
const uint32_t kIQ3_SGrid[512] = {
#include "common/quant/iq3_s_grid.inc"
};

}  // namespace mer
