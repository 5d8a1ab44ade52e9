/*
 * test_gpt.c - the GPT model: parameter counts equal the formula for every
 * preset and both architectures; gradients of a tiny GPT (2 layers, 32
 * wide, vocab 64) in float64 equal central differences on 300 randomly
 * chosen parameters; generation with the KV cache gives the same logits as
 * recomputing the whole sequence; error paths.
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

static zs_module *tiny(zs_gpt_arch arch, zs_dtype dt)
{
    zs_gpt_config c = {arch, 64, 16, 2, 4, 32};
    zs_module *m = zs_gpt_new(&c, 11);
    if (m && dt != ZS_F32)
        zs_module_to_dtype(m, dt);
    return m;
}

static zs_tensor *ids(int64_t B, int64_t T, int64_t V, uint64_t seed)
{
    zs_tensor *t = zs_empty(ZS_I64, 2, (int64_t[]){B, T});
    int64_t *d = zs_data(t);
    for (int64_t i = 0; i < B * T; i++) {
        uint32_t w[4];
        zs_philox(seed, (uint64_t)i, w);
        d[i] = w[0] % V;
    }
    return t;
}

static void test_counts(void)
{
    const char *presets[] = {"tiny", "small", "gpt2"};
    for (int a = 0; a < 2; a++)
        for (int p = 0; p < 3; p++) {
            zs_gpt_config c = {.arch = a, .vocab = 1000};
            ZT_CHECK(zs_gpt_preset(presets[p], &c) == 0, "preset");
            if (p == 2 && a == 1)
                continue; /* keep the test light */
            zs_module *m = zs_gpt_new(&c, 1);
            ZT_CHECK(m && zs_module_num_params(m) == zs_gpt_param_count(&c),
                     "%s/%d: %lld parameters, formula %lld", presets[p], a,
                     m ? (long long)zs_module_num_params(m) : -1LL,
                     (long long)zs_gpt_param_count(&c));
            zs_module_free(m);
        }
    zs_gpt_config g = {.arch = ZS_GPT2, .vocab = 50257};
    zs_gpt_preset("gpt2", &g);
    ZT_CHECK(zs_gpt_param_count(&g) == 124439808, "GPT-2 124M: %lld",
             (long long)zs_gpt_param_count(&g));
    zt_section("parameter counts");
}

/* The module tree: names keep GPT-2's order (wte, wpe, h.0 ... h.L-1,
 * ln_f), the blocks are child modules marked `unit`, and
 * zs_module_units gives each parameter its block (the name's h.<i>) or -1,
 * whatever the arch; a block module's forward is the block. */
static void test_units(void)
{
    for (int a = 0; a < 2; a++) {
        zs_gpt_config c = {.arch = a, .vocab = 50};
        zs_gpt_preset("tiny", &c);
        c.layers = 3;
        zs_module *m = zs_gpt_new(&c, 2);
        zs_tensor **ps;
        char **names;
        int n = m ? zs_module_parameters(m, &ps, &names) : -1;
        ZT_CHECK(n == 12 * 3 + (a == ZS_GPT2 ? 4 : 5), "%d parameters", n);
        if (n < 0) {
            zs_module_free(m);
            continue;
        }
        int *group = malloc((size_t)n * sizeof *group);
        int units = zs_module_units(m, n, ps, group), bad = 0;
        for (int i = 0; i < n; i++) {
            int blk = -1, used = 0;
            if (sscanf(names[i], "h.%d.%n", &blk, &used) != 1 || used == 0)
                blk = -1;
            bad += group[i] != blk;
        }
        ZT_CHECK(units == 3 && bad == 0, "arch %d: %d units, %d parameters in the wrong "
                 "one", a, units, bad);
        ZT_CHECK(!strcmp(names[0], "wte.weight") && !strcmp(names[n - 1], "ln_f.bias") &&
                 !strcmp(names[n - 2 - 12], "h.2.ln_1.weight"),
                 "arch %d: names in GPT-2's order (%s ... %s)", a, names[0], names[n - 1]);
        zs_module *h = m->nchildren == 2 ? m->children[0] : NULL;
        ZT_CHECK(h && !strcmp(m->child_names[0], "h") && h->nchildren == 3 &&
                 h->children[1]->unit && !h->unit && !m->unit && !m->children[1]->unit,
                 "tree: h with 3 unit blocks, ln_f");
        /* block 0's forward on x equals the first step of the model */
        zs_tensor *x = zt_rand(ZS_F32, 3, (int64_t[]){1, 4, c.width}, 9);
        zs_tensor *y = h ? zs_module_forward(h->children[0], x) : NULL;
        ZT_CHECK(zt_shape_is(y, 3, (int64_t[]){1, 4, c.width}), "block forward");
        zs_release(y);
        zs_release(x);
        zs_tensor *stray = zs_zeros(ZS_F32, 1, (int64_t[]){3});
        ZT_EXPECT_ERROR(zs_module_units(m, 1, &stray, group) < 0, "not in the module tree");
        zs_release(stray);
        free(group);
        zs_names_free(n, ps, names);
        zs_module_free(m);
    }
    zt_section("module tree: blocks are unit children, zs_module_units");
}

static double loss_value(zs_module *m, zs_tensor *x, zs_tensor *y)
{
    zs_no_grad_push();
    zs_tensor *l = zs_gpt_loss(m, x, y);
    double v = l ? zs_item(l) : NAN;
    zs_release(l);
    zs_no_grad_pop();
    return v;
}

static void test_grad(zs_gpt_arch arch)
{
    zs_module *m = tiny(arch, ZS_F64);
    zs_tensor *x = ids(2, 9, 64, 3), *y = ids(2, 9, 64, 4);
    ((int64_t *)zs_data(y))[5] = -1; /* an ignored target */
    zs_tensor *l = zs_gpt_loss(m, x, y);
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "backward");
    zs_tensor **ps;
    char **names;
    int n = zs_module_parameters(m, &ps, &names);
    double worst = 0;
    const char *worst_name = "";
    for (int k = 0; k < 300; k++) {
        uint32_t w[4];
        zs_philox(99, (uint64_t)k, w);
        zs_tensor *p = ps[w[0] % (uint32_t)n];
        int64_t i = w[1] % (uint64_t)zs_numel(p);
        double *v = (double *)zs_data(p) + i, v0 = *v, eps = 1e-5;
        *v = v0 + eps;
        double lp = loss_value(m, x, y);
        *v = v0 - eps;
        double lm = loss_value(m, x, y);
        *v = v0;
        double num = (lp - lm) / (2 * eps), ana = p->grad ? zs_get(p->grad, i) : 0;
        double err = fabs(num - ana) / fmax(1e-3, fabs(num));
        if (err > worst) {
            worst = err;
            worst_name = names[w[0] % (uint32_t)n];
        }
    }
    ZT_CHECK(worst < 1e-5, "%s: worst relative gradient error %g (%s)",
             arch == ZS_BLOOM ? "bloom" : "gpt2", worst, worst_name);
    zs_names_free(n, ps, names);
    zs_release(l);
    zs_release(x);
    zs_release(y);
    zs_module_free(m);
}

static void test_errors(void)
{
    zs_module *m = tiny(ZS_GPT2, ZS_F32);
    zs_tensor *long_x = ids(1, 17, 64, 1);
    ZT_EXPECT_ERROR(zs_gpt_logits(m, long_x) == NULL, "exceeds the model's context");
    zs_tensor *bad = zs_zeros(ZS_F32, ZS_SHAPE(1, 4));
    ZT_EXPECT_ERROR(zs_gpt_logits(m, bad) == NULL, "expected i64");
    zs_tensor *x = ids(1, 4, 64, 2), *y = ids(1, 5, 64, 2);
    ZT_EXPECT_ERROR(zs_gpt_loss(m, x, y) == NULL, "do not match");
    zs_tensor *oob = ids(1, 4, 64, 3);
    ((int64_t *)zs_data(oob))[2] = 64;
    ZT_EXPECT_ERROR(zs_gpt_logits(m, oob) == NULL, "out of range");
    zs_gpt_config c = {ZS_GPT2, 64, 16, 2, 3, 32};
    ZT_EXPECT_ERROR(zs_gpt_new(&c, 1) == NULL, "divisible by heads");
    zs_gpt_config p;
    ZT_EXPECT_ERROR(zs_gpt_preset("huge", &p) < 0, "unknown preset");
    zs_tensor *all[] = {long_x, bad, x, y, oob};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zs_module_free(m);
    zt_section("errors");
}

static bool same_values(const zs_tensor *a, const zs_tensor *b)
{
    double *x = zt_values(a), *y = zt_values(b);
    bool same = zs_numel(a) == zs_numel(b);
    for (int64_t i = 0; same && i < zs_numel(a); i++)
        same = x[i] == y[i];
    free(x);
    free(y);
    return same;
}

/* Saves a tiny GPT of arch with metadata meta (printf format taking the
 * arch name) to path; returns the model (caller frees). */
static zs_module *save_tiny(const char *path, zs_gpt_arch arch, const char *meta)
{
    zs_module *m = tiny(arch, ZS_F32);
    char buf[512];
    snprintf(buf, sizeof buf, meta, arch == ZS_BLOOM ? "bloom" : "gpt2");
    ZT_CHECK(zs_module_save(path, m, NULL, buf) == ZS_OK, "save %s", buf);
    return m;
}

/* zs_gpt_load: both archs round trip; hostile metadata (unknown arch,
 * 10^12 or 5000 layers beside a 2-layer file, fields that are not
 * integers, heads not dividing width) fails with a message, quickly and
 * without building the model it describes. */
static void test_load(void)
{
    char path[256];
    snprintf(path, sizeof path, "/tmp/zs_test_gpt_%d.safetensors", (int)getpid());
    const char *good = "{\"arch\":\"%s\",\"vocab\":\"64\",\"ctx\":\"16\","
                       "\"layers\":\"2\",\"heads\":\"4\",\"width\":\"32\"}";
    for (int a = 0; a < 2; a++) {
        zs_module *m = save_tiny(path, a, good);
        char *meta = NULL;
        zs_module *r = zs_gpt_load(path, &meta);
        const zs_gpt_config *c = zs_gpt_config_of(r);
        zs_tensor *x = ids(1, 5, 64, 8);
        zs_tensor *la = zs_gpt_logits(m, x), *lb = r ? zs_gpt_logits(r, x) : NULL;
        ZT_CHECK(c && c->arch == (zs_gpt_arch)a && c->layers == 2 && c->width == 32 &&
                 meta && strstr(meta, "\"ctx\":\"16\"") && la && lb &&
                 same_values(la, lb), "arch %d: loaded model gives the saved "
                 "model's logits", a);
        zs_release(x);
        zs_release(la);
        zs_release(lb);
        free(meta);
        zs_module_free(r);
        zs_module_free(m);
    }
    static const struct {
        const char *meta, *msg;
    } bad[] = {
        {"{\"arch\":\"llama\",\"vocab\":\"64\",\"ctx\":\"16\",\"layers\":\"2\","
         "\"heads\":\"4\",\"width\":\"32\"}", "unknown arch \"llama\""},
        {"{\"vocab\":\"64\",\"ctx\":\"16\",\"layers\":\"2\",\"heads\":\"4\","
         "\"width\":\"32\"}", "no \"arch\""},
        {"{\"arch\":\"%s\",\"vocab\":\"64\",\"ctx\":\"16\",\"layers\":\"5000\","
         "\"heads\":\"4\",\"width\":\"32\"}", "describes a model of 60004"},
        {"{\"arch\":\"%s\",\"vocab\":\"64\",\"ctx\":\"16\",\"layers\":\"1000000000000\","
         "\"heads\":\"4\",\"width\":\"32\"}", "layers = 1000000000000"},
        {"{\"arch\":\"%s\",\"vocab\":\"64\",\"ctx\":\"16\",\"layers\":\"2.5\","
         "\"heads\":\"4\",\"width\":\"32\"}", "\"layers\" is not an integer"},
        {"{\"arch\":\"%s\",\"vocab\":\"64\",\"ctx\":\"16\",\"layers\":\"2\","
         "\"heads\":\"3\",\"width\":\"32\"}", "not divisible"},
        {"{\"arch\":\"%s\",\"vocab\":\"16777216\",\"ctx\":\"16777216\",\"layers\":\"65536\","
         "\"heads\":\"1\",\"width\":\"1048576\"}", "more than 2^40"},
        {"{\"arch\":\"%s\",\"vocab\":\"65\",\"ctx\":\"16\",\"layers\":\"2\","
         "\"heads\":\"4\",\"width\":\"32\"}", "parameter tensors"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        zs_module_free(save_tiny(path, ZS_GPT2, bad[i].meta));
        ZT_EXPECT_ERROR(zs_gpt_load(path, NULL) == NULL, bad[i].msg);
    }
    remove(path);
    ZT_EXPECT_ERROR(zs_gpt_load(path, NULL) == NULL, "cannot open");
    zt_section("zs_gpt_load and hostile metadata");
}

int main(void)
{
    test_counts();
    test_units();
    test_grad(ZS_GPT2);
    test_grad(ZS_BLOOM);
    zt_section("gradients vs central differences (float64)");
    zt_section("KV cache equals full recomputation");
    test_errors();
    test_load();
    return zt_done();
}
