/* The tools' results on stdout: a write that failed (a full disk, a closed
 * pipe, /dev/full) must not end the program with status 0, and stdio only
 * reports it at the flush. zt_output_check_at_exit registers the check once
 * per program, as gnulib's close_stdout does. */
#ifndef ZT_OUTPUT_H
#define ZT_OUTPUT_H

/* At exit, flush and close stdout; on an error print "<tool>: cannot write
 * the output: <why>" to stderr and end the process with status 1. */
void zt_output_check_at_exit(const char *tool);

#endif
