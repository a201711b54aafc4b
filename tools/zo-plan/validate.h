/* zo-plan --validate: a plan checked against a short run of zo-train's
 * trainer in this process (the same engine, model and data path zo-train
 * uses), for its measured peaks and step time. Speed figures are what a
 * tool reports, not what a test asserts: this machine's load decides them. */
#ifndef ZP_VALIDATE_H
#define ZP_VALIDATE_H

#include "plan.h"
#include "trainer.h"

typedef struct zp_validation {
    double step_seconds; /* median wall time of the steps after the first (which records the
                            engine's trace), or of the only one */
    zo_step_stats last;  /* the last step's statistics: peak_* as zo-train --json reports them */
    uint64_t device_high_water; /* the device's, activations included */
} zp_validation;

/* zo-train's options for the job under the plan on this hardware. */
zt_options zp_trainer_options(const zp_job *job, const zp_hardware *hw, const zp_plan *p,
                              const char *data, const char *nvme_dir);

/* Run `steps` (>= 1) optimizer steps of the job under the plan's placement,
 * chunk size and the hardware's device budget, on data (a text or ZOTOKENS
 * file), with swap files in nvme_dir when a home is NVMe. */
zo_status zp_validate(const zp_job *job, const zp_hardware *hw, const zp_plan *p, const char *data,
                      const char *nvme_dir, int steps, zp_validation *out);

#endif
