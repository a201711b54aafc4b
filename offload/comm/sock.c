/* Sockets with deadlines (sock.h). */
#include "sock.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include "zo/units.h"

int zo_sock_ms_left(uint64_t deadline_ns)
{
    uint64_t now = zo_now_ns();
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now) / 1000000 + 1);
}

int zo_sock_move(int fd, void *buf, size_t n, int out, uint64_t deadline_ns)
{
    unsigned char *p = buf;
    while (n) {
        struct pollfd pfd = {fd, out ? POLLOUT : POLLIN, 0};
        int left = zo_sock_ms_left(deadline_ns);
        int pr = left ? poll(&pfd, 1, left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0)
            return ETIMEDOUT;
        if (pr < 0)
            return errno;
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (k == 0)
            return ENOTCONN;
        if (k < 0)
            return errno;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}
