/* cohort: the task farm's wire protocol (farm_internal.h): framed messages
 * on the TCP streams between rank 0 and each worker rank, and connecting
 * them: rank 0 listens on the one address its ranks reach it by (loopback
 * when they all share its host), the address, port and a random secret told
 * by MPI_Bcast; a connection proves it is one of the job's ranks by the
 * secret (compared in constant time) within FARM_HELLO_MS, else it is closed
 * and rank 0 goes on accepting. */
#define _GNU_SOURCE
#include "framework/farm/farm_internal.h"

#include "framework/core/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
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

/* What a worker sends first on its stream: who it is and the job's secret. */
#define FARM_SECRET_LEN 32
#define FARM_HELLO_MAGIC 0x4d524643u /* "CFRM" */
typedef struct {
    uint32_t magic;
    int32_t rank;
    unsigned char secret[FARM_SECRET_LEN];
} hello_t;

/* A connection has this long to say hello (a stranger that sends nothing
 * must not hold up the start); the ranks have 60 s to connect in all. */
#define FARM_HELLO_MS 10000
#define FARM_CONNECT_MS 60000
#define FARM_PENDING_MAX 64 /* handshakes at once; a further one closes the oldest */
#define FARM_ADDR_MAX 64

static int same_secret(const unsigned char *a, const unsigned char *b)
{
    unsigned d = 0; /* constant time: no early exit on the first difference */
    for (int i = 0; i < FARM_SECRET_LEN; i++) d |= (unsigned)(a[i] ^ b[i]);
    return d == 0;
}

static ch_status random_secret(unsigned char *out)
{
    size_t got = 0;
    while (got < FARM_SECRET_LEN) {
        ssize_t r = getrandom(out + got, FARM_SECRET_LEN - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return CH_ERROR(CH_ERR_IO, "farm: getrandom for the job's secret: %s", strerror(errno));
        got += (size_t)r;
    }
    return CH_OK;
}

/* The numeric address (text) of the first address host resolves to, or "?". */
static void first_address(const char *host, char *out)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    snprintf(out, FARM_ADDR_MAX, "?");
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return;
    char buf[INET6_ADDRSTRLEN] = "";
    if (res->ai_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)res->ai_addr)->sin_addr, buf, sizeof buf);
    else if (res->ai_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)res->ai_addr)->sin6_addr, buf, sizeof buf);
    if (*buf) snprintf(out, FARM_ADDR_MAX, "%s", buf);
    freeaddrinfo(res);
}

/* A listening socket on numeric address addr (NULL: every address, dual
 * stack where IPv6 is on), port chosen by the kernel. -1 and errno on failure. */
static int listen_on(const char *addr, int backlog, int *port)
{
    struct sockaddr_storage ss;
    socklen_t al;
    memset(&ss, 0, sizeof ss);
    int fd = -1;
    if (addr) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
        if (getaddrinfo(addr, "0", &hints, &res) != 0 || !res) {
            errno = EADDRNOTAVAIL;
            return -1;
        }
        memcpy(&ss, res->ai_addr, res->ai_addrlen);
        al = res->ai_addrlen;
        fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        freeaddrinfo(res);
    } else {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        a6->sin6_family = AF_INET6;
        a6->sin6_addr = in6addr_any;
        al = sizeof *a6;
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) { /* IPv4 where IPv6 is off */
            struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
            memset(&ss, 0, sizeof ss);
            a4->sin_family = AF_INET;
            a4->sin_addr.s_addr = htonl(INADDR_ANY);
            al = sizeof *a4;
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        }
    }
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&ss, al) != 0 || listen(fd, backlog) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &al) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* Rank 0: where to listen. Ranks on other hosts said which address rank 0's
 * host name gives them (views, FARM_ADDR_MAX each; "" from rank 0's host,
 * "?" unresolved): none elsewhere, loopback; else the first address they
 * named, or (not an address of this host: NAT, an alias) every address,
 * warned. *pub gets the address to publish. */
static int listen_for_ranks(const char *views, int size, const char *host, int *port, char *pub)
{
    const char *want = NULL;
    int remote = 0;
    for (int r = 1; r < size; r++) {
        const char *v = views + (size_t)r * FARM_ADDR_MAX;
        if (!*v) continue;
        remote = 1;
        if (!want && strcmp(v, "?") != 0) want = v;
    }
    int backlog = size + FARM_PENDING_MAX;
    if (!remote) {
        snprintf(pub, FARM_ADDR_MAX, "127.0.0.1");
        int fd = listen_on(pub, backlog, port);
        if (fd >= 0) return fd;
        snprintf(pub, FARM_ADDR_MAX, "::1");
        return listen_on(pub, backlog, port);
    }
    if (want) {
        snprintf(pub, FARM_ADDR_MAX, "%s", want);
        int fd = listen_on(want, backlog, port);
        if (fd >= 0) return fd;
        ch_log_warn("farm: rank 0 cannot listen on %s, the address its ranks know its host %s "
                    "by (%s): listening on every address of the host (connections still have "
                    "to prove they are this job's)", want, host, strerror(errno));
    } else {
        snprintf(pub, FARM_ADDR_MAX, "%s", host);
    }
    return listen_on(NULL, backlog, port);
}

typedef struct {
    int fd;
    size_t got;
    int64_t deadline; /* mono ns */
    hello_t h;
    char peer[INET6_ADDRSTRLEN + 8];
} pending_t;

static void peer_name(int fd, char *out, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t al = sizeof ss;
    char buf[INET6_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &al) == 0) {
        if (ss.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf, sizeof buf);
        else if (ss.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, buf, sizeof buf);
        int port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                  : ((struct sockaddr_in *)&ss)->sin_port);
        snprintf(out, len, "%s port %d", buf, port);
        return;
    }
    snprintf(out, len, "%s", buf);
}

static void refuse(pending_t *p, const char *why)
{
    ch_log_warn("farm: rank 0 refused a connection from %s: %s (not one of this job's ranks)",
                p->peer, why);
    close(p->fd);
    p->fd = -1;
}

/* Rank 0: accept until every worker rank has said hello with the secret;
 * strangers are refused and do not stop the start. */
static ch_status accept_ranks(ch_farm_t *f, int lfd, int port, const unsigned char *secret)
{
    pending_t pend[FARM_PENDING_MAX];
    int n_pend = 0, connected = 0, want = f->size - 1;
    struct pollfd pfd[FARM_PENDING_MAX + 1];
    int64_t end = ch_farm_mono_ns_() + (int64_t)FARM_CONNECT_MS * 1000000;
    ch_status s = CH_OK;
    while (connected < want) {
        int64_t now = ch_farm_mono_ns_(), wake = end;
        if (now >= end) {
            s = CH_ERROR(CH_ERR_IO, "farm: only %d of %d ranks connected to rank 0 (port %d) "
                         "within %d s", connected, want, port, FARM_CONNECT_MS / 1000);
            break;
        }
        /* handshakes past their time: closed */
        for (int i = 0; i < n_pend; i++) {
            if (pend[i].deadline <= now) refuse(&pend[i], "said nothing valid within the handshake time");
            else if (pend[i].deadline < wake) wake = pend[i].deadline;
        }
        int k = 0;
        for (int i = 0; i < n_pend; i++)
            if (pend[i].fd >= 0) pend[k++] = pend[i];
        n_pend = k;
        pfd[0] = (struct pollfd){lfd, POLLIN, 0};
        for (int i = 0; i < n_pend; i++) pfd[1 + i] = (struct pollfd){pend[i].fd, POLLIN, 0};
        int r = poll(pfd, (nfds_t)(1 + n_pend), (int)((wake - now) / 1000000 + 1));
        if (r < 0 && errno != EINTR) {
            s = CH_ERROR(CH_ERR_IO, "farm: poll: %s", strerror(errno));
            break;
        }
        if (r <= 0) continue;
        for (int i = 0; i < n_pend; i++) {
            pending_t *p = &pend[i];
            if (!pfd[1 + i].revents) continue;
            ssize_t g = recv(p->fd, (char *)&p->h + p->got, sizeof p->h - p->got, 0);
            if (g < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (g <= 0) {
                refuse(p, g == 0 ? "closed before its hello" : strerror(errno));
                continue;
            }
            p->got += (size_t)g;
            if (p->got < sizeof p->h) continue;
            int r0 = p->h.rank, ok_secret = same_secret(p->h.secret, secret);
            if (p->h.magic != FARM_HELLO_MAGIC || !ok_secret) {
                refuse(p, "wrong hello or secret");
            } else if (r0 < 1 || r0 >= f->size || f->conns[r0].fd >= 0) {
                refuse(p, "the secret, but a rank number not expected");
            } else {
                int fl = fcntl(p->fd, F_GETFL);
                if (fl >= 0) fcntl(p->fd, F_SETFL, fl & ~O_NONBLOCK);
                nodelay(p->fd);
                f->conns[r0].fd = p->fd;
                p->fd = -1;
                connected++;
            }
        }
        if (pfd[0].revents) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd < 0) continue;
            k = 0;
            for (int i = 0; i < n_pend; i++)
                if (pend[i].fd >= 0) pend[k++] = pend[i];
            n_pend = k;
            if (n_pend == FARM_PENDING_MAX) { /* the oldest handshake gives way */
                refuse(&pend[0], "too many handshakes at once");
                memmove(pend, pend + 1, sizeof *pend * (size_t)--n_pend);
            }
            pending_t *p = &pend[n_pend++];
            memset(p, 0, sizeof *p);
            p->fd = fd;
            p->deadline = ch_farm_mono_ns_() + (int64_t)FARM_HELLO_MS * 1000000;
            peer_name(fd, p->peer, sizeof p->peer);
        }
    }
    for (int i = 0; i < n_pend; i++)
        if (pend[i].fd >= 0) close(pend[i].fd); /* strangers still talking: the start is over */
    return s;
}

/* Rank 0 listens on a TCP port of its host; every worker connects and says
 * its rank and the job's secret. (MPI carries only setup and the final
 * summary: a blocking MPI receive spins a core in MPICH, which would take it
 * from the tasks.) */
ch_status ch_farm_connect_ranks_(ch_farm_t *f)
{
    char host[256] = "", addr[FARM_ADDR_MAX] = "";
    unsigned char secret[FARM_SECRET_LEN];
    int port = 0, lfd = -1;
    ch_status s = CH_OK;
    f->n_conns = f->rank == 0 ? f->size : 1;
    f->conns = calloc((size_t)f->n_conns, sizeof *f->conns);
    if (!f->conns) s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    for (int i = 0; f->conns && i < f->n_conns; i++) f->conns[i].fd = -1;
    CH_TRY(ch_farm_agree_(f->comm, f->rank, s));
    if (f->size == 1) return CH_OK;
    /* where rank 0 is: its host name, and the address each rank elsewhere knows it by */
    if (f->rank == 0) gethostname(host, sizeof host - 1);
    MPI_Bcast(host, sizeof host, MPI_CHAR, 0, f->comm);
    char mine[256] = "", view[FARM_ADDR_MAX] = "";
    gethostname(mine, sizeof mine - 1);
    if (f->rank != 0 && strcmp(mine, host) != 0) first_address(host, view);
    char *views = f->rank == 0 ? calloc((size_t)f->size, FARM_ADDR_MAX) : NULL;
    if (f->rank == 0 && !views) s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    MPI_Gather(view, FARM_ADDR_MAX, MPI_CHAR, views, FARM_ADDR_MAX, MPI_CHAR, 0, f->comm);
    if (!s && f->rank == 0) {
        lfd = listen_for_ranks(views, f->size, host, &port, addr);
        if (lfd < 0)
            s = CH_ERROR(CH_ERR_IO, "farm: rank 0 cannot listen on a TCP port (%s): %s", addr,
                         strerror(errno));
        if (!s) s = random_secret(secret);
        if (!s) ch_log_debug("farm: rank 0 listens on %s port %d", addr, port);
    }
    free(views);
    ch_status a = ch_farm_agree_(f->comm, f->rank, s);
    if (a) {
        if (lfd >= 0) close(lfd);
        return a;
    }
    MPI_Bcast(addr, sizeof addr, MPI_CHAR, 0, f->comm);
    MPI_Bcast(&port, 1, MPI_INT, 0, f->comm);
    MPI_Bcast(secret, sizeof secret, MPI_BYTE, 0, f->comm);
    if (f->rank != 0) {
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        struct addrinfo hints, *res = NULL, *ai;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        int e = getaddrinfo(addr, ps, &hints, &res);
        int fd = -1;
        for (ai = e ? NULL : res; ai; ai = ai->ai_next) {
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
            if (fd >= 0) close(fd);
            fd = -1;
        }
        if (res) freeaddrinfo(res);
        if (fd < 0)
            s = CH_ERROR(CH_ERR_IO, "farm: cannot connect to rank 0 at %s port %d: %s", addr,
                         port, e ? gai_strerror(e) : strerror(errno));
        else {
            nodelay(fd);
            hello_t h;
            memset(&h, 0, sizeof h);
            h.magic = FARM_HELLO_MAGIC;
            h.rank = f->rank;
            memcpy(h.secret, secret, sizeof secret);
            s = send_all(fd, &h, sizeof h);
            explicit_bzero(&h, sizeof h);
            f->conns[0].fd = fd;
        }
    } else {
        s = accept_ranks(f, lfd, port, secret);
    }
    explicit_bzero(secret, sizeof secret);
    if (lfd >= 0) close(lfd);
    return ch_farm_agree_(f->comm, f->rank, s);
}
