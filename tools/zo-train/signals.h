/* zo-train's stop signals: SIGINT, SIGTERM and SIGHUP (how a terminal, Slurm
 * and Kubernetes stop or preempt a job) ask the run to stop after the step
 * in progress; a second SIGINT exits at once. */
#ifndef ZT_SIGNALS_H
#define ZT_SIGNALS_H

/* Block the stop signals in the calling thread, and so in every thread it
 * creates afterwards, and start the thread that waits for them. Call it
 * before any other thread exists. 0, or -1 with the last error set. */
int zt_signals_start(void);
/* The stop signal received (SIGINT, SIGTERM or SIGHUP), 0 when none. */
int zt_signal_pending(void);
/* "SIGINT", "SIGTERM", "SIGHUP" (or "signal"). */
const char *zt_signal_name(int sig);

#endif
