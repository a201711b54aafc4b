/* zo-plan --pipeline-stages: the pipeline plans (pipeline.h) for people
 * (tables) and for programs (the "pipeline" JSON object), and the zo-train
 * command that runs one. */
#ifndef ZP_PIPELINE_OUT_H
#define ZP_PIPELINE_OUT_H

#include <jansson.h>
#include <stddef.h>

#include "pipeline.h"

/* The plans compared (one per stage count) and the one recommended. */
typedef struct zp_pipe_report {
    const zp_pipeline_plan *plans;
    int n, best;     /* best: the most tokens/s that fits, -1 none */
    int auto_stages; /* --pipeline-stages auto: the stage count was the planner's */
    const zp_job *job;
    const zp_world *w;
    const zp_hardware *node;
    const zp_speeds *node_sp;
} zp_pipe_report;

/* mpirun -np N zo-train --pipeline-stages S --pipeline-split ... for plan p:
 * the flags every rank shares (zo-train takes one set): the farthest homes
 * any stage planned, the fewest resident parameters, the node's host memory
 * (each rank takes its share) and --placement auto, with which each
 * stage's engine fills its own host with its states as its plan does. */
void zp_pipe_command(const zp_pipeline_plan *p, const zp_job *job, const zp_hardware *hw, char *buf,
                     size_t cap);

void zp_print_pipeline(const zp_pipe_report *r);
json_t *zp_json_pipeline(const zp_pipe_report *r);

#endif
