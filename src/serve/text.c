/*
 * text.c - output text for the server: a growing buffer, JSON string
 * literals that are valid whatever the bytes (model output from a
 * byte-level tokenizer need not be UTF-8), UTF-8 checks, and the hold-back
 * rule of streaming (zs/serve.h: never stream text past a stop string).
 *
 * Invalid bytes become U+FFFD one byte at a time, deciding at each lead
 * byte from it and its continuations only; so text cut where
 * zsi_utf8_complete allows and written piece by piece gives the same JSON
 * text as written whole, which keeps streamed and whole answers equal.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

static bool grow(zsi_buf *b, size_t extra)
{
    if (b->oom)
        return false;
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t c = b->cap ? b->cap : 256;
    while (c < b->len + extra + 1)
        c *= 2;
    char *p = realloc(b->p, c);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p, b->cap = c;
    return true;
}

void zsi_buf_add(zsi_buf *b, const void *data, size_t n)
{
    if (!grow(b, n))
        return;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
}

void zsi_buf_puts(zsi_buf *b, const char *s) { zsi_buf_add(b, s, strlen(s)); }

void zsi_buf_printf(zsi_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        zsi_buf_add(b, small, (size_t)n);
        return;
    }
    if (!grow(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void zsi_buf_free(zsi_buf *b)
{
    free(b->p);
    *b = (zsi_buf){0};
}

void zsi_buf_json_num(zsi_buf *b, double v)
{
    if (isfinite(v))
        zsi_buf_printf(b, "%.9g", v);
    else
        zsi_buf_puts(b, "null");
}

/* Length of the valid UTF-8 character at s[0, n), 0 when invalid, or
 * -(bytes so far) when it is valid but cut short by n. */
static int char_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len;
    unsigned lo = 0x80, hi = 0xBF; /* the range of the first continuation */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80; /* no overlong forms */
        hi = c == 0xED ? 0x9F : 0xBF; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF; /* at most U+10FFFF */
    } else {
        return 0;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return -i;
        unsigned d = s[i];
        if (d < (i == 1 ? lo : 0x80) || d > (i == 1 ? hi : 0xBF))
            return 0;
    }
    return len;
}

bool zsi_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int l = char_len(u + i, n - i);
        if (l <= 0)
            return false;
        i += (size_t)l;
    }
    return true;
}

size_t zsi_utf8_complete(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    /* a character being completed starts within the last 3 bytes */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        int l = char_len(u + n - back, back);
        if (l < 0)
            return n - back;
        if (u[n - back] < 0x80 || u[n - back] >= 0xC0)
            break; /* a lead byte (or ASCII) that is complete or invalid */
    }
    return n;
}

void zsi_buf_json_str(zsi_buf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    zsi_buf_add(b, "\"", 1);
    size_t run = 0; /* start of bytes to copy as they are */
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int l = char_len(u + i, n - i);
        if (l == 1 && c >= 0x20 && c != '"' && c != '\\') {
            i++;
            continue;
        }
        if (l > 1) {
            i += (size_t)l;
            continue;
        }
        zsi_buf_add(b, s + run, i - run);
        if (l <= 0)
            zsi_buf_add(b, "\xEF\xBF\xBD", 3); /* U+FFFD */
        else if (c == '"' || c == '\\')
            zsi_buf_printf(b, "\\%c", c);
        else if (c == '\n')
            zsi_buf_puts(b, "\\n");
        else if (c == '\r')
            zsi_buf_puts(b, "\\r");
        else if (c == '\t')
            zsi_buf_puts(b, "\\t");
        else
            zsi_buf_printf(b, "\\u%04x", c);
        run = ++i;
    }
    zsi_buf_add(b, s + run, n - run);
    zsi_buf_add(b, "\"", 1);
}

size_t zsi_stop_holdback(const char *text, size_t n, char *const *stop, int n_stop)
{
    size_t hold = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t wl = strlen(stop[i]);
        for (size_t k = wl ? wl - 1 : 0; k > hold; k--) /* proper prefixes, longest first */
            if (k <= n && !memcmp(text + n - k, stop[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}
