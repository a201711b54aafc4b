/* Sockets with deadlines, shared by the rendezvous (rendezvous.c) and the
 * tcp backend (comm_tcp.c): each moves whole buffers with poll() bounded by
 * a deadline, so that a peer that never answers is named, not waited for. */
#ifndef ZO_COMM_SOCK_H
#define ZO_COMM_SOCK_H

#include <stddef.h>
#include <stdint.h>

/* Milliseconds until deadline_ns (zo_now_ns's clock), rounded up; 0 once
 * it passed. */
int zo_sock_ms_left(uint64_t deadline_ns);

/* Sends (out) or receives exactly n bytes on fd, blocking or not, before
 * the deadline. Returns 0, ETIMEDOUT when the deadline passed, ENOTCONN
 * when the peer closed the connection (end of stream), else the errno of
 * the call that failed. */
int zo_sock_move(int fd, void *buf, size_t n, int out, uint64_t deadline_ns);

#endif
