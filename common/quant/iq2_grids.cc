#include "common/quant/iq2.h"

namespace mer {

// IQ2_XXS's 256 grid points as the format defines them (ggml-common.h, iq2xxs_grid): byte i of an
// entry is element i's magnitude code, 0x08, 0x19 or 0x2b.
const uint64_t kIQ2_XXSGrid[256] = {
#include "common/quant/iq2_xxs_grid.inc"
};

// IQ2_XS's 512 grid points as the format defines them (ggml-common.h, iq2xs_grid), coded as
// IQ2_XXS's.
const uint64_t kIQ2_XSGrid[512] = {
#include "common/quant/iq2_xs_grid.inc"
};

// IQ2_S's 1024 grid points as the format defines them (ggml-common.h, iq2s_grid), coded as
// IQ2_XXS's.
const uint64_t kIQ2_SGrid[1024] = {
#include "common/quant/iq2_s_grid.inc"
};

}  // namespace mer
