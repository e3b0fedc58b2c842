/* cohort: the task farm's wire protocol (farm_internal.h): framed messages
 * on the TCP streams between rank 0 and each worker rank, and connecting
 * them (rank 0 listens, the port told by MPI_Bcast). */
#define _GNU_SOURCE
#include "framework/farm/farm_internal.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static ch_status send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return CH_ERROR(CH_ERR_IO, "farm stream: send: %s", strerror(errno));
        c += w;
        n -= (size_t)w;
    }
    return CH_OK;
}

ch_status ch_farm_write_frame_(int fd, int type, const void *p, size_t len)
{
    frame_t h = {(uint32_t)type, (uint32_t)len};
    char buf[4096];
    if (len + sizeof h > sizeof buf) { /* large: header, then body */
        CH_TRY(send_all(fd, &h, sizeof h));
        return send_all(fd, p, len);
    }
    memcpy(buf, &h, sizeof h);
    if (len) memcpy(buf + sizeof h, p, len);
    return send_all(fd, buf, len + sizeof h);
}

/* Read what is there into c->in. Returns 1 on data, 0 at end of stream, -1 on error. */
int ch_farm_conn_read_(conn_t *c)
{
    if (c->cap - c->len < 65536) {
        size_t cap = c->cap ? 2 * c->cap : 131072;
        char *p = realloc(c->in, cap);
        if (!p) return -1;
        c->in = p;
        c->cap = cap;
    }
    ssize_t r;
    do r = recv(c->fd, c->in + c->len, c->cap - c->len, 0);
    while (r < 0 && errno == EINTR);
    if (r < 0) return -1;
    if (r == 0) return 0;
    c->len += (size_t)r;
    return 1;
}

/* The next complete frame in c->in (header in *h, body at *body), or 0. */
int ch_farm_conn_frame_(conn_t *c, size_t *off, frame_t *h, const char **body)
{
    if (c->len - *off < sizeof *h) return 0;
    memcpy(h, c->in + *off, sizeof *h);
    if (c->len - *off - sizeof *h < h->len) return 0;
    *body = c->in + *off + sizeof *h;
    *off += sizeof *h + h->len;
    return 1;
}

void ch_farm_conn_consumed_(conn_t *c, size_t off)
{
    memmove(c->in, c->in + off, c->len - off);
    c->len -= off;
}

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Rank 0 listens on a TCP port of its host; every worker connects and says
 * its rank. (MPI carries only setup and the final summary: a blocking MPI
 * receive spins a core in MPICH, which would take it from the tasks.) */
ch_status ch_farm_connect_ranks_(ch_farm_t *f)
{
    char host[256] = "";
    int port = 0, lfd = -1;
    ch_status s = CH_OK;
    f->n_conns = f->rank == 0 ? f->size : 1;
    f->conns = calloc((size_t)f->n_conns, sizeof *f->conns);
    if (!f->conns) s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    for (int i = 0; f->conns && i < f->n_conns; i++) f->conns[i].fd = -1;
    if (!s && f->rank == 0 && f->size > 1) {
        /* IPv6 (dual stack: IPv4 clients too), or IPv4 where IPv6 is off */
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        memset(&a6, 0, sizeof a6);
        memset(&a4, 0, sizeof a4);
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a4.sin_family = AF_INET;
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int v6 = lfd >= 0;
        if (!v6) lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr *a = v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4;
        socklen_t al = v6 ? sizeof a6 : sizeof a4;
        if (lfd < 0 || bind(lfd, a, al) != 0 || listen(lfd, f->size) != 0 ||
            getsockname(lfd, a, &al) != 0)
            s = CH_ERROR(CH_ERR_IO, "farm: rank 0 cannot listen on a TCP port: %s", strerror(errno));
        port = ntohs(v6 ? a6.sin6_port : a4.sin_port);
        gethostname(host, sizeof host - 1);
    }
    CH_TRY(ch_farm_agree_(f->comm, f->rank, s));
    if (f->size == 1) return CH_OK;
    MPI_Bcast(host, sizeof host, MPI_CHAR, 0, f->comm);
    MPI_Bcast(&port, 1, MPI_INT, 0, f->comm);
    if (f->rank != 0) {
        char mine[256] = "", ps[16];
        gethostname(mine, sizeof mine - 1);
        snprintf(ps, sizeof ps, "%d", port);
        struct addrinfo hints, *res = NULL, *ai;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        const char *target = strcmp(mine, host) == 0 ? "localhost" : host;
        int e = getaddrinfo(target, ps, &hints, &res);
        int fd = -1;
        for (ai = e ? NULL : res; ai; ai = ai->ai_next) {
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
            if (fd >= 0) close(fd);
            fd = -1;
        }
        if (res) freeaddrinfo(res);
        if (fd < 0)
            s = CH_ERROR(CH_ERR_IO, "farm: cannot connect to rank 0 at %s port %d: %s", target,
                         port, e ? gai_strerror(e) : strerror(errno));
        else {
            nodelay(fd);
            int32_t r = f->rank;
            if (send(fd, &r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r)
                s = CH_ERROR(CH_ERR_IO, "farm: send to rank 0: %s", strerror(errno));
            f->conns[0].fd = fd;
        }
    } else {
        for (int i = 1; !s && i < f->size; i++) {
            struct pollfd p = {lfd, POLLIN, 0};
            if (poll(&p, 1, 60000) != 1) {
                s = CH_ERROR(CH_ERR_IO, "farm: only %d of %d ranks connected to rank 0 (port %d) "
                             "within 60 s", i - 1, f->size - 1, port);
                break;
            }
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            int32_t r = -1;
            if (fd < 0 || recv(fd, &r, sizeof r, MSG_WAITALL) != (ssize_t)sizeof r || r < 1 ||
                r >= f->size || f->conns[r].fd >= 0) {
                s = CH_ERROR(CH_ERR_IO, "farm: bad connection to rank 0 (rank %d)", (int)r);
                if (fd >= 0) close(fd);
                break;
            }
            nodelay(fd);
            f->conns[r].fd = fd;
        }
    }
    if (lfd >= 0) close(lfd);
    return ch_farm_agree_(f->comm, f->rank, s);
}
