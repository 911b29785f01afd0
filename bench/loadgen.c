/*
 * loadgen: a closed-loop HTTP/1.1 keep-alive load generator over a Unix socket.
 *
 * One thread, epoll, C connections; each connection sends its request, waits for
 * the whole answer (Content-Length or chunked), then sends the next. Every server
 * of the bench is driven by this one program, so no server is measured with a
 * client faster or slower than another's.
 *
 *   loadgen -u SOCKET -c CONNECTIONS -d SECONDS [-w WARMUP_S] [-m METHOD] [-p PATH]
 *           [-b BODY] [-H 'Name: value']... [-S 'Name: prefix-%d']
 *
 * -S adds one header per connection, %d replaced by the connection's index
 * (capd's per-session policy keys on it). Prints one JSON line on stdout:
 * requests answered inside the measured window (after the warm-up), calls/s,
 * latency percentiles of those requests in microseconds, answers that were not
 * 2xx, transport errors, and the CPU this generator itself used while measuring
 * (cpu_pct near 100 means the generator, not the server, was the limit).
 *
 * Bounded: it stops sending at the end of the window and gives in-flight
 * requests at most 2 s more. Exit status 2 on a usage or connect error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define BUF_SIZE (256 * 1024)
#define MAX_HEADERS 16

struct conn {
    int fd;
    char *req;          /* this connection's request bytes */
    size_t req_len;
    size_t sent;        /* bytes of req written so far */
    char *buf;          /* bytes read, not yet consumed */
    size_t have;
    uint64_t started_ns;
    int busy;           /* a request is in flight */
    int want_out;       /* registered for EPOLLOUT */
};

static const char *sock_path;
static int epfd;
static uint64_t *lat;
static size_t lat_n, lat_cap;
static uint64_t non_2xx, errors_n, reconnects;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static int open_conn(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, sock_path, sizeof addr.sun_path - 1);
    /* A blocking connect: the server is up, and a full backlog should wait, not fail. */
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void watch(struct conn *c, int out) {
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = out;
}

static int add(struct conn *c) {
    c->fd = open_conn();
    if (c->fd < 0) return -1;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    c->want_out = 0;
    c->have = 0;
    return epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);
}

static void flush(struct conn *c) {
    while (c->sent < c->req_len) {
        ssize_t n = write(c->fd, c->req + c->sent, c->req_len - c->sent);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (!c->want_out) watch(c, 1);
                return;
            }
            return; /* the read side will see the error */
        }
        c->sent += (size_t)n;
    }
    if (c->want_out) watch(c, 0);
}

static void send_req(struct conn *c) {
    c->started_ns = now_ns();
    c->sent = 0;
    c->busy = 1;
    flush(c);
}

/* Length of one whole answer at the start of buf, 0 if not all there, -1 if unparseable.
 * Sets *status and *closing (the server said Connection: close). */
static long answer_len(const char *buf, size_t have, int *status, int *closing) {
    const char *end = memmem(buf, have, "\r\n\r\n", 4);
    if (!end) return have > 64 * 1024 ? -1 : 0;
    size_t head = (size_t)(end - buf) + 4;
    if (head < 12 || memcmp(buf, "HTTP/1.", 7) != 0) return -1;
    *status = atoi(buf + 9);
    *closing = 0;
    long length = -1;
    int chunked = 0;
    const char *line = memchr(buf, '\n', head) + 1;
    while (line < end) {
        const char *eol = memchr(line, '\n', (size_t)(end + 2 - line));
        if (!eol) break;
        if (strncasecmp(line, "content-length:", 15) == 0) length = atol(line + 15);
        else if (strncasecmp(line, "transfer-encoding:", 18) == 0 &&
                 memmem(line, (size_t)(eol - line), "chunked", 7)) chunked = 1;
        else if (strncasecmp(line, "connection:", 11) == 0 &&
                 memmem(line, (size_t)(eol - line), "close", 5)) *closing = 1;
        line = eol + 1;
    }
    if (*status == 204 || *status == 304) return (long)head;
    if (chunked) {
        size_t at = head;
        for (;;) {
            const char *crlf = memmem(buf + at, have - at, "\r\n", 2);
            if (!crlf) return 0;
            long size = strtol(buf + at, NULL, 16);
            at = (size_t)(crlf - buf) + 2;
            if (size == 0) {
                /* no trailers expected: the final CRLF */
                return have >= at + 2 ? (long)(at + 2) : 0;
            }
            if (have < at + (size_t)size + 2) return 0;
            at += (size_t)size + 2;
        }
    }
    if (length < 0) return -1;
    return have >= head + (size_t)length ? (long)(head + (size_t)length) : 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(double q) {
    if (!lat_n) return 0;
    size_t i = (size_t)(q * (double)lat_n);
    if (i >= lat_n) i = lat_n - 1;
    return lat[i] / 1e3;
}

static void usage(void) {
    fprintf(stderr, "usage: loadgen -u SOCKET -c CONNECTIONS -d SECONDS [-w WARMUP_S] "
                    "[-m METHOD] [-p PATH] [-b BODY] [-H 'N: v']... [-S 'N: x-%%d']\n");
    exit(2);
}

int main(int argc, char **argv) {
    int conns = 1;
    double seconds = 1, warmup = 0.5;
    const char *method = "GET", *path = "/", *body = "", *per_conn = NULL;
    const char *headers[MAX_HEADERS];
    int nheaders = 0, opt;
    while ((opt = getopt(argc, argv, "u:c:d:w:m:p:b:H:S:")) != -1) {
        switch (opt) {
        case 'u': sock_path = optarg; break;
        case 'c': conns = atoi(optarg); break;
        case 'd': seconds = atof(optarg); break;
        case 'w': warmup = atof(optarg); break;
        case 'm': method = optarg; break;
        case 'p': path = optarg; break;
        case 'b': body = optarg; break;
        case 'H': if (nheaders < MAX_HEADERS) headers[nheaders++] = optarg; break;
        case 'S': per_conn = optarg; break;
        default: usage();
        }
    }
    if (!sock_path || conns < 1 || conns > 10000 || seconds <= 0 || seconds > 600 || warmup < 0)
        usage();

    char extra[4096] = "";
    size_t used = 0;
    for (int i = 0; i < nheaders; i++)
        used += (size_t)snprintf(extra + used, sizeof extra - used, "%s\r\n", headers[i]);
    size_t body_len = strlen(body);

    epfd = epoll_create1(EPOLL_CLOEXEC);
    struct conn *cs = calloc((size_t)conns, sizeof *cs);
    for (int i = 0; i < conns; i++) {
        char mine[256] = "";
        if (per_conn) {
            snprintf(mine, sizeof mine - 2, per_conn, i);
            strcat(mine, "\r\n");
        }
        size_t cap = 512 + used + strlen(mine) + strlen(path) + body_len;
        cs[i].req = malloc(cap);
        cs[i].req_len = (size_t)snprintf(
            cs[i].req, cap,
            "%s %s HTTP/1.1\r\nHost: bench\r\n%s%sContent-Type: application/json\r\n"
            "Content-Length: %zu\r\n\r\n%s",
            method, path, extra, mine, body_len, body);
        cs[i].buf = malloc(BUF_SIZE);
        if (add(&cs[i]) < 0) {
            fprintf(stderr, "loadgen: cannot connect to %s: %s\n", sock_path, strerror(errno));
            return 2;
        }
    }

    lat_cap = 1 << 20;
    lat = malloc(lat_cap * sizeof *lat);
    uint64_t t0 = now_ns();
    uint64_t measure_at = t0 + (uint64_t)(warmup * 1e9);
    uint64_t stop_at = measure_at + (uint64_t)(seconds * 1e9);
    uint64_t give_up_at = stop_at + 2000000000ull;
    double cpu_at_measure = -1, cpu_at_stop = -1;
    int in_flight = 0;
    for (int i = 0; i < conns; i++) {
        send_req(&cs[i]);
        in_flight++;
    }

    struct epoll_event events[256];
    while (in_flight > 0) {
        uint64_t t = now_ns();
        if (cpu_at_measure < 0 && t >= measure_at) cpu_at_measure = cpu_s();
        if (cpu_at_stop < 0 && t >= stop_at) cpu_at_stop = cpu_s();
        if (t >= give_up_at) break;
        int n = epoll_wait(epfd, events, 256, 100);
        for (int e = 0; e < n; e++) {
            struct conn *c = events[e].data.ptr;
            if (events[e].events & EPOLLOUT) flush(c);
            if (!(events[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
            int broken = 0;
            for (;;) {
                if (c->have == BUF_SIZE) { broken = 1; break; }
                ssize_t r = read(c->fd, c->buf + c->have, BUF_SIZE - c->have);
                if (r > 0) { c->have += (size_t)r; continue; }
                if (r == 0) broken = 1;
                else if (errno != EAGAIN && errno != EWOULDBLOCK) broken = 1;
                break;
            }
            int status = 0, closing = 0;
            long len = c->busy ? answer_len(c->buf, c->have, &status, &closing) : 0;
            if (len > 0) {
                uint64_t done = now_ns();
                c->busy = 0;
                in_flight--;
                if (c->started_ns >= measure_at && done <= stop_at) {
                    if (lat_n == lat_cap) {
                        lat_cap *= 2;
                        lat = realloc(lat, lat_cap * sizeof *lat);
                    }
                    lat[lat_n++] = done - c->started_ns;
                    if (status < 200 || status > 299) non_2xx++;
                }
                memmove(c->buf, c->buf + len, c->have - (size_t)len);
                c->have -= (size_t)len;
                if (closing) broken = 1;
            } else if (len < 0) {
                broken = 1;
            }
            if (broken) {
                if (c->busy) {
                    errors_n++;
                    c->busy = 0;
                    in_flight--;
                }
                epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                if (now_ns() >= stop_at) continue;
                reconnects++;
                if (add(c) < 0) {
                    errors_n++;
                    continue;
                }
            }
            if (!c->busy && now_ns() < stop_at) {
                send_req(c);
                in_flight++;
            }
        }
    }
    uint64_t t_end = now_ns();
    if (cpu_at_measure < 0) cpu_at_measure = cpu_s();
    if (cpu_at_stop < 0) cpu_at_stop = cpu_s();
    qsort(lat, lat_n, sizeof *lat, cmp_u64);
    double window = t_end < stop_at ? (t_end - measure_at) / 1e9 : seconds;
    printf("{\"requests\": %zu, \"seconds\": %.3f, \"rps\": %.1f, \"p50_us\": %.1f, "
           "\"p90_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f, \"non_2xx\": %llu, "
           "\"errors\": %llu, \"reconnects\": %llu, \"unanswered\": %d, \"cpu_pct\": %.1f}\n",
           lat_n, window, lat_n / window, pct(0.5), pct(0.9), pct(0.99),
           lat_n ? lat[lat_n - 1] / 1e3 : 0.0, (unsigned long long)non_2xx,
           (unsigned long long)errors_n, (unsigned long long)reconnects, in_flight,
           100.0 * (cpu_at_stop - cpu_at_measure) / seconds);
    return 0;
}
