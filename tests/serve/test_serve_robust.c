/*
 * test_serve_robust.c - `zs serve` (a child process, on a random-weight
 * GPT written here, with its default thread pool: ctest runs this test
 * again as test_serve_robust_t16 with ZS_NUM_THREADS=16) under hostile
 * load, then a soak:
 *   - ZS_SERVE_REQUESTS requests (default 10000) from 16 client threads, a fixed mix (seed
 *     printed) of valid completions, chats and streams interleaved with
 *     truncated and invalid JSON, wrong types, huge numbers, NaN, 10^5
 *     nested '[', invalid UTF-8, 10 MB bodies (by Content-Length and
 *     chunked), requests cut off mid-body, bytes that are not HTTP, unknown
 *     paths and methods, streaming clients that vanish after the first
 *     event and clients that vanish while waiting for a whole answer;
 *     meanwhile 4 slow senders send a valid request a byte per 50 ms.
 *     Every valid request must get 200 with well-formed JSON and the
 *     expected fields, every hostile one its status (400, 404, 405, 413) or
 *     a closed connection;
 *   - ZS_SERVE_SOAK_S seconds (default 10; 5 with sanitizers) of 64
 *     concurrent streaming clients: no errors, and VmRSS at the end within
 *     10% + 16 MiB of VmRSS after the first second (not checked with
 *     sanitizers: ASan's quarantine grows by design);
 *   - after each of the two, the server's own counts (/metrics) are back
 *     to zero: connections and HTTP requests (but the /metrics request's
 *     own), answers, requests in flight, queued and in the engine,
 *     sequences, KV blocks; /health answers 200;
 *   - SIGTERM: exit status 0, which under ASan means LeakSanitizer found
 *     no leak at exit.
 * When the server stops answering, the test says whether it died (the
 * signal, and its stderr) or is up and wedged: issue 30's "no answer"
 * was a server killed by SIGSEGV (a thread pool race), not a wedge.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve/serve_util.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

#define SEED 20240611u
#define THREADS 16
#define SLOW 4
#define SOAK_CLIENTS 64

static int port;

/* ---- the child server ---------------------------------------------------------- */

static pid_t spawn(const char *dir, int *port_out, char *err_path)
{
    const char *bin_dir = getenv("ZS_BINARY_DIR");
    char bin[4096], ckpt[4096], log[4096];
    snprintf(bin, sizeof bin, "%s/zs", bin_dir ? bin_dir : ".");
    snprintf(ckpt, sizeof ckpt, "%s", dir);
    snprintf(log, sizeof log, "%s/requests.jsonl", dir);
    snprintf(err_path, 4096, "%s/stderr", dir);
    int pfd[2];
    if (pipe(pfd))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        FILE *e = fopen(err_path, "w");
        if (e)
            dup2(fileno(e), 2);
        close(pfd[0]);
        execl(bin, bin, "serve", "--ckpt", ckpt, "--port", "0", "--log", log, "--kv-blocks",
              "512", "--max-queue", "10000", "--read-timeout", "10", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    FILE *out = fdopen(pfd[0], "r");
    char line[512];
    *port_out = 0;
    while (out && fgets(line, sizeof line, out)) {
        char *p = strstr(line, "127.0.0.1:");
        if (p && (*port_out = atoi(p + 10)) > 0)
            break;
    }
    if (out)
        fclose(out); /* the child's later output goes nowhere (it writes none) */
    return pid;
}

static long vm_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

/* The server's stderr, printed once (when it died or would not stop). */
static char err_path[4096];

static void print_stderr(void)
{
    static bool printed;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "tail -60 %s >&2", err_path);
    if (!printed && system(cmd) != 0)
        fprintf(stderr, "(no server stderr)\n");
    printed = true;
}

/* True while the server process runs; when it has ended, says how (its
 * status into *status) and prints its stderr. */
static bool alive(pid_t pid, int *status)
{
    if (*status != -1)
        return false;
    int st;
    if (waitpid(pid, &st, WNOHANG) != pid)
        return true;
    *status = st;
    fprintf(stderr, "the server died: %s %d\n", WIFSIGNALED(st) ? "signal" : "exit status",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    print_stderr();
    return false;
}

static int server_status = -1; /* the server's wait status, once it ended */

/* The server's counts (/metrics) back to zero within 10 s, but for the
 * /metrics request's own connection and request; /health answers 200.
 * When the server does not answer: dead (how) or up and wedged. */
static void settled(pid_t pid, const char *phase)
{
    static const char *const zero[] = {
        "zs_requests_in_flight", "zs_generations_answering", "zs_requests_queued",
        "zs_engine_requests", "zs_running_sequences", "zs_waiting_sequences",
        "zs_kv_blocks_used"};
    const char *left = "no answer from /metrics";
    double t0 = zt_now(), v = -1;
    while (left && zt_now() - t0 < 10) {
        zt_resp r;
        left = NULL;
        if (zt_request(port, "GET", "/metrics", NULL, NULL, 0, &r) != 200)
            left = "no answer from /metrics";
        for (size_t i = 0; !left && i < sizeof zero / sizeof *zero; i++)
            if ((v = zt_metric(r.body, zero[i])) != 0)
                left = zero[i];
        if (!left && (v = zt_metric(r.body, "zs_connections_open")) != 1)
            left = "zs_connections_open (less the /metrics request's)";
        if (!left && (v = zt_metric(r.body, "zs_http_requests_active")) != 1)
            left = "zs_http_requests_active (less the /metrics request's)";
        zt_resp_free(&r);
        if (left)
            usleep(20000);
    }
    zt_resp r;
    int health = zt_request(port, "GET", "/health", NULL, NULL, 0, &r);
    zt_resp_free(&r);
    bool up = alive(pid, &server_status);
    ZT_CHECK(!left && health == 200, "%s: %s%s (%g), /health %d; the server %s", phase,
             left ? left : "counts at 0", left ? " not back to 0 after 10 s" : "", v, health,
             up ? "is up" : "died (above)");
    if (!left && health == 200)
        printf("%s: every count back to 0 in %.2f s, /health 200\n", phase, zt_now() - t0);
}

/* ---- checks of answers ------------------------------------------------------------ */

static bool is_str(const cJSON *o, const char *k)
{
    return cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, k));
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* A whole completion or chat answer with its fields. */
static bool answer_ok(const char *body, bool chat)
{
    cJSON *j = cJSON_Parse(body ? body : "");
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    const cJSON *c0 = cJSON_GetArrayItem(ch, 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(c0, "message");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(j, "object");
    bool ok = is_str(j, "id") && cJSON_IsString(obj) &&
              !strcmp(obj->valuestring, chat ? "chat.completion" : "text_completion") &&
              cJSON_GetArraySize(ch) == 1 && is_str(c0, "finish_reason") &&
              (chat ? is_str(msg, "content") : is_str(c0, "text")) &&
              num(u, "prompt_tokens") > 0 && num(u, "completion_tokens") >= 0 &&
              num(u, "total_tokens") == num(u, "prompt_tokens") + num(u, "completion_tokens");
    cJSON_Delete(j);
    return ok;
}

/* A whole stream: JSON chunks, one with a finish_reason, then [DONE]. */
static bool stream_ok(const char *rest)
{
    bool done = false, finished = false, ok = rest != NULL;
    for (const char *p = rest; ok && p && *p;) {
        const char *e = strstr(p, "\n\n");
        if (!e || strncmp(p, "data: ", 6)) {
            ok = !e && !*p;
            break;
        }
        size_t n = (size_t)(e - p) - 6;
        if (n == 6 && !strncmp(p + 6, "[DONE]", 6)) {
            done = true;
        } else {
            cJSON *j = cJSON_ParseWithLength(p + 6, n);
            const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
            ok = j && !done && is_str(c0, "text");
            finished = finished || is_str(c0, "finish_reason");
            cJSON_Delete(j);
        }
        p = e + 2;
    }
    return ok && done && finished;
}

/* ---- the request mix ----------------------------------------------------------------- */

typedef struct tally {
    int64_t sent, failed;
    char first[512];
} tally;

static void fail(tally *t, int i, const char *what, int status, const char *body)
{
    if (t->failed++ == 0)
        snprintf(t->first, sizeof t->first, "request %d (%s): status %d, %.300s", i, what,
                 status, body ? body : "");
}

static uint64_t next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static const char *valid_completion =
    "{\"prompt\": \"In the beginning\", \"max_tokens\": 3, \"temperature\": 0.8}";
static const char *valid_chat =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"The light\"}], \"max_tokens\": 3}";

/* Sends raw bytes, half-closes, and reads whatever comes back. */
static int raw(const char *bytes, size_t n, zt_resp *r)
{
    memset(r, 0, sizeof *r);
    r->status = -1;
    int fd = zt_connect(port, 20);
    if (fd < 0)
        return -2;
    if (zt_send_all(fd, bytes, n)) {
        shutdown(fd, SHUT_WR);
        zt_read_resp(fd, r);
    }
    close(fd);
    return r->status;
}

/* A 10 MB body: by Content-Length (answered from the headers: only the
 * first 64 KiB are sent) or chunked (all of it). */
static int big_body(bool chunked, zt_resp *r)
{
    int fd = zt_connect(port, 20);
    if (fd < 0)
        return -2;
    const char *h = chunked ? "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              "Transfer-Encoding: chunked\r\n\r\n"
                            : "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 10485760\r\n\r\n";
    char *piece = malloc(65536 + 16);
    if (!piece) {
        close(fd);
        return -2;
    }
    int cl = chunked ? snprintf(piece, 16, "10000\r\n") : 0;
    memset(piece + cl, '[', 65536);
    memcpy(piece + cl + 65536, "\r\n", 2);
    size_t pn = (size_t)cl + 65536 + (chunked ? 2 : 0);
    bool ok = zt_send_all(fd, h, strlen(h));
    for (int i = 0; ok && i < (chunked ? 160 : 1); i++)
        ok = zt_send_all(fd, piece, pn);
    if (ok && chunked)
        ok = zt_send_all(fd, "0\r\n\r\n", 5);
    zt_read_resp(fd, r);
    close(fd);
    free(piece);
    return r->status;
}

/* A stream whose client leaves after its first event. */
static bool vanish(void)
{
    zt_sse s;
    const char *b = "{\"prompt\": \"In\", \"max_tokens\": 200, \"ignore_eos\": true, "
                    "\"stream\": true}";
    bool ok = zt_sse_open(port, "/v1/completions", b, NULL, &s) && s.head.status == 200;
    char *ev = ok ? zt_sse_next(&s) : NULL;
    ok = ev != NULL;
    free(ev);
    zt_sse_close(&s);
    return ok;
}

/* A long whole answer asked for; the client leaves before it comes. */
static void vanish_waiting(void)
{
    const char *b = "{\"prompt\": \"In\", \"max_tokens\": 200, \"ignore_eos\": true}";
    char h[256];
    int n = snprintf(h, sizeof h, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Length: %zu\r\n\r\n", strlen(b));
    int fd = zt_connect(port, 20);
    if (fd >= 0 && zt_send_all(fd, h, (size_t)n) && zt_send_all(fd, b, strlen(b)))
        usleep(5000);
    if (fd >= 0)
        close(fd);
}

/* Request i of the mix; counts a failure in t. */
static void one(int i, uint64_t *rng, tally *t)
{
    static const char *const hostile[] = {
        "{\"prompt\": 5}", "{\"prompt\": \"x\", \"temperature\": \"hot\"}",
        "{\"prompt\": \"x\", \"max_tokens\": 1e400}", "{\"prompt\": \"x\", \"top_p\": NaN}",
        "{\"prompt\": \"x\", \"n\": 99999999999}", "{\"prompt\": \"x\", \"stop\": {}}",
        "{\"prompt\": \"\xff\xfe\"}", "{\"messages\": \"hi\"}", "[[[[",
        "{\"prompt\": \"x\", \"seed\": -1e300}", "{\"prompt\": [1, 2, -3]}", "nul\0l"};
    zt_resp r = {0};
    int kind = (int)(next(rng) % 20), st;
    const char *what = "";
    t->sent++;
    switch (kind) {
    case 0: case 1: case 2: case 3: /* valid whole completions and chats */
        what = kind < 3 ? "completion" : "chat";
        st = zt_request(port, "POST", kind < 3 ? "/v1/completions" : "/v1/chat/completions",
                        NULL, kind < 3 ? valid_completion : valid_chat,
                        strlen(kind < 3 ? valid_completion : valid_chat), &r);
        if (st != 200 || !answer_ok(r.body, kind == 3))
            fail(t, i, what, st, r.body);
        break;
    case 4: case 5: { /* valid streams */
        zt_sse s;
        char b[256];
        snprintf(b, sizeof b, "{\"prompt\": \"The word\", \"max_tokens\": %d, \"stream\": true}",
                 1 + (int)(next(rng) % 6));
        bool ok = zt_sse_open(port, "/v1/completions", b, NULL, &s) && s.head.status == 200;
        char *rest = ok ? zt_sse_rest(&s) : NULL;
        if (!ok || !stream_ok(rest))
            fail(t, i, "stream", s.head.status, rest);
        free(rest);
        zt_sse_close(&s);
        break;
    }
    case 6: case 7: case 8: case 9: { /* mistyped, out of range, not UTF-8 */
        const char *b = hostile[next(rng) % (sizeof hostile / sizeof *hostile)];
        size_t n = strlen(b) + (b[0] == 'n'); /* "nul\0l" keeps its NUL */
        st = zt_request(port, "POST", "/v1/completions", NULL, b, n, &r);
        if (st != 400)
            fail(t, i, b, st, r.body);
        break;
    }
    case 10: case 11: { /* valid JSON cut short */
        size_t cut = 1 + next(rng) % (strlen(valid_completion) - 2);
        st = zt_request(port, "POST", "/v1/completions", NULL, valid_completion, cut, &r);
        if (st != 400)
            fail(t, i, "truncated", st, r.body);
        break;
    }
    case 12: { /* deep nesting */
        char *deep = malloc(100000);
        memset(deep, '[', 100000);
        st = zt_request(port, "POST", "/v1/completions", NULL, deep, 100000, &r);
        if (st != 400)
            fail(t, i, "deep", st, r.body);
        free(deep);
        break;
    }
    case 13: /* 10 MB bodies, now and then */
        if (next(rng) % 16 == 0 && (st = big_body(next(rng) % 4 == 0, &r)) != 413)
            fail(t, i, "10 MB", st, r.body);
        break;
    case 14: /* not HTTP at all; a request cut off in its body */
        if (next(rng) % 2) {
            char junk[64];
            for (size_t k = 0; k < sizeof junk; k++)
                junk[k] = (char)next(rng);
            raw(junk, sizeof junk, &r);
        } else {
            const char *cut = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 100\r\n\r\n{\"prompt\": \"x";
            raw(cut, strlen(cut), &r);
        }
        break; /* any answer or none: the server must just stay up */
    case 15:
        st = zt_request(port, "GET", "/v1/nothing", NULL, NULL, 0, &r);
        if (st != 404)
            fail(t, i, "404", st, r.body);
        break;
    case 16:
        st = zt_request(port, "PUT", "/v1/chat/completions", NULL, "{}", 2, &r);
        if (st != 405)
            fail(t, i, "405", st, r.body);
        break;
    case 17:
        if (!vanish())
            fail(t, i, "vanishing stream", -1, NULL);
        break;
    case 18: /* a whole answer asked for, and the client gone before it */
        vanish_waiting();
        break;
    default: /* the cheap endpoints */
        st = zt_request(port, "POST", "/tokenize", NULL, "{\"prompt\": \"In the light\"}", 26,
                        &r);
        if (st != 200 || !strstr(r.body, "\"count\""))
            fail(t, i, "tokenize", st, r.body);
        break;
    }
    zt_resp_free(&r);
}

typedef struct worker {
    int id, count;
    tally t;
} worker;

static void *run_worker(void *arg)
{
    worker *w = arg;
    uint64_t rng = SEED + 977u * (uint64_t)w->id;
    for (int i = 0; i < w->count; i++)
        one(w->id * w->count + i, &rng, &w->t);
    return NULL;
}

/* A valid request sent a byte per 50 ms. */
static void *slow_sender(void *arg)
{
    tally *t = arg;
    char req[512];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Length: %zu\r\n\r\n%s", strlen(valid_completion),
                     valid_completion);
    int fd = zt_connect(port, 30);
    bool ok = fd >= 0;
    for (int i = 0; ok && i < n; i++) {
        ok = zt_send_all(fd, req + i, 1);
        usleep(50000);
    }
    zt_resp r = {0};
    t->sent++;
    if (!ok || !zt_read_resp(fd, &r) || r.status != 200 || !answer_ok(r.body, false))
        fail(t, 0, "slow sender", r.status, r.body);
    zt_resp_free(&r);
    if (fd >= 0)
        close(fd);
    return NULL;
}

static void hostile_load(pid_t pid, int total)
{
    worker w[THREADS];
    tally slow[SLOW] = {{0}};
    pthread_t th[THREADS], ts[SLOW];
    double t0 = zt_now();
    for (int i = 0; i < SLOW; i++)
        pthread_create(&ts[i], NULL, slow_sender, &slow[i]);
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){i, total / THREADS, {0}};
        pthread_create(&th[i], NULL, run_worker, &w[i]);
    }
    int64_t sent = 0, failed = 0;
    for (int i = 0; i < THREADS + SLOW; i++) {
        tally *t = i < THREADS ? &w[i].t : &slow[i - THREADS];
        pthread_join(i < THREADS ? th[i] : ts[i - THREADS], NULL);
        sent += t->sent;
        failed += t->failed;
        ZT_CHECK(t->failed == 0, "%lld failures, first: %s", (long long)t->failed, t->first);
    }
    double dt = zt_now() - t0;
    printf("hostile load: %lld requests (seed %u) in %.1f s, %lld failed\n", (long long)sent,
           SEED, dt, (long long)failed);
    settled(pid, "after the hostile load");
    zt_section("hostile requests among valid ones: every answer right, counts at 0");
}

/* ---- the soak ------------------------------------------------------------------------ */

typedef struct soaker {
    double until;
    int64_t streams;
    tally t;
} soaker;

static void *soak_client(void *arg)
{
    soaker *s = arg;
    while (zt_now() < s->until) {
        zt_sse e;
        const char *b = "{\"prompt\": \"And God said\", \"max_tokens\": 24, \"stream\": true}";
        bool ok = zt_sse_open(port, "/v1/completions", b, NULL, &e) && e.head.status == 200;
        char *rest = ok ? zt_sse_rest(&e) : NULL;
        s->t.sent++;
        if (!ok || !stream_ok(rest))
            fail(&s->t, (int)s->streams, "soak stream", e.head.status, rest);
        s->streams++;
        free(rest);
        zt_sse_close(&e);
    }
    return NULL;
}

static void soak(pid_t pid, double seconds)
{
    static soaker s[SOAK_CLIENTS];
    pthread_t th[SOAK_CLIENTS];
    double t0 = zt_now();
    for (int i = 0; i < SOAK_CLIENTS; i++) {
        s[i] = (soaker){t0 + seconds, 0, {0}};
        pthread_create(&th[i], NULL, soak_client, &s[i]);
    }
    usleep(1000000);
    long early = vm_rss_kib(pid);
    int64_t streams = 0;
    for (int i = 0; i < SOAK_CLIENTS; i++) {
        pthread_join(th[i], NULL);
        streams += s[i].streams;
        ZT_CHECK(s[i].t.failed == 0, "soak client %d: %lld failures, first: %s", i,
                 (long long)s[i].t.failed, s[i].t.first);
    }
    long late = vm_rss_kib(pid);
    printf("soak: %d clients, %lld streams in %.1f s; VmRSS %ld KiB after 1 s, %ld KiB at "
           "the end\n", SOAK_CLIENTS, (long long)streams, zt_now() - t0, early, late);
    if (!SANITIZED)
        ZT_CHECK(early > 0 && late <= early + early / 10 + 16384,
                 "memory flat: %ld -> %ld KiB", early, late);
    settled(pid, "after the soak");
    zt_section("soak: 64 concurrent streaming clients, no errors, memory flat, counts at 0");
}

int main(void)
{
    const char *n_env = getenv("ZS_SERVE_REQUESTS"), *s_env = getenv("ZS_SERVE_SOAK_S");
    int total = n_env ? atoi(n_env) : 10000;
    double soak_s = s_env ? atof(s_env) : SANITIZED ? 5 : 10;
    char dir[] = "/tmp/zs_serve_robust_XXXXXX";
    ZT_CHECK(mkdtemp(dir) != NULL, "scratch directory");
    zs_bpe *b = zt_serve_bpe();
    ZT_CHECK(b && zt_serve_save(b, 256, 2, 64, dir) == ZS_OK, "checkpoint written");
    zs_bpe_free(b);
    signal(SIGPIPE, SIG_IGN);
    pid_t pid = spawn(dir, &port, err_path);
    ZT_CHECK(pid > 0 && port > 0, "zs serve started (port %d)", port);
    if (pid > 0 && port > 0) {
        hostile_load(pid, total);
        if (server_status == -1) /* not when it died */
            soak(pid, soak_s);
    }
    bool up = pid > 0 && alive(pid, &server_status);
    int status = server_status;
    if (up) {
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
    }
    ZT_CHECK(up && WIFEXITED(status) && WEXITSTATUS(status) == 0,
             "SIGTERM: exit status %d%s (LeakSanitizer reports make it non-zero)",
             WIFEXITED(status) ? WEXITSTATUS(status) : -1,
             up ? "" : ", but it had ended before");
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        print_stderr();
    zt_section("SIGTERM: the server exits 0 (no leak under ASan)");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return zt_done();
}
