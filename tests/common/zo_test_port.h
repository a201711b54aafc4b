/* A free TCP port on the loopback for tests that start ranks (the
 * rendezvous's MASTER_PORT): the kernel's pick, released at once. */
#ifndef ZO_TEST_PORT_H
#define ZO_TEST_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* 0 when no socket could be bound. */
static inline int zo_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int ok = fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
             !getsockname(fd, (struct sockaddr *)&a, &len);
    if (fd >= 0)
        close(fd);
    return ok ? ntohs(a.sin_port) : 0;
}

#endif
