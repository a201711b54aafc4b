/* zoffload: the optimizer mode's names (zo/optim_mode.h). In the core, not
 * the engine, because the engine and the DeepSpeed config parser (which does
 * not link the engine) both name modes. */
#include "zo/optim_mode.h"

const char *zo_optim_mode_name(zo_optim_mode m)
{
    switch (m) {
    case ZO_OPTIM_SYNC: return "sync";
    case ZO_OPTIM_OVERLAP: return "overlap";
    case ZO_OPTIM_DPU: return "dpu";
    }
    return "?";
}
