/* train_parity_main.c — the C side of tests/bert/test_optim_torch.py.
 *
 * Runs N optimizer steps of our AdamW + clipping + schedule on the cpu device
 * for the loss L = sum_i 0.5 * s_i * ||p_i - t_i||^2 (so each gradient,
 * s_i * (p_i - t_i), depends on the current weights, as in training), and
 * writes the final weights, the learning rate and the gradient norm of every
 * step. The test runs the same with torch.optim.AdamW, clip_grad_norm_ and
 * LambdaLR(get_linear_schedule_with_warmup's lambda) and compares.
 *
 * usage: train_parity SPEC.json
 *   spec: {"steps","lr","warmup_ratio","schedule","max_grad_norm",
 *          "weight_decay","beta1","beta2","eps","optimizer":"adamw"|"adamw8",
 *          "params":[{"name","shape":[...],"no_decay":0|1,"scale":s}],
 *          "in": f32 file (all p then all t, in param order),
 *          "out": f32 file (final p in order, then lr[steps], norm[steps])}
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_train.h"

#define MAXP 64

static int fail(const char *msg) {
    fprintf(stderr, "train_parity: %s\n", msg);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return fail("usage: train_parity SPEC.json");
    json_error_t je;
    json_t *spec = json_load_file(argv[1], 0, &je);
    if (!spec)
        return fail(je.text);
    tk_config c;
    memset(&c, 0, sizeof c);
    int steps = (int)json_integer_value(json_object_get(spec, "steps"));
    c.lr = (float)json_number_value(json_object_get(spec, "lr"));
    c.warmup_ratio = (float)json_number_value(json_object_get(spec, "warmup_ratio"));
    snprintf(c.schedule, sizeof c.schedule, "%s", json_string_value(json_object_get(spec, "schedule")));
    c.max_grad_norm = (float)json_number_value(json_object_get(spec, "max_grad_norm"));
    c.weight_decay = (float)json_number_value(json_object_get(spec, "weight_decay"));
    c.adam_beta1 = (float)json_number_value(json_object_get(spec, "beta1"));
    c.adam_beta2 = (float)json_number_value(json_object_get(spec, "beta2"));
    c.adam_eps = (float)json_number_value(json_object_get(spec, "eps"));
    const char *opt_name = json_string_value(json_object_get(spec, "optimizer"));
    c.optimizer = opt_name && strcmp(opt_name, "adamw8") == 0 ? TK_OPTIM_ADAMW8 : TK_OPTIM_ADAMW;
    json_t *jp = json_object_get(spec, "params");
    int np = (int)json_array_size(jp);
    if (np < 1 || np > MAXP || steps < 1)
        return fail("spec needs 1..64 params and steps >= 1");

    tk_err err = { 0 };
    tk_dev_opts dopts = { .kind = TK_DEV_CPU, .threads = 1 };
    tk_dev *d = tk_dev_new(&dopts, &err);
    if (!d)
        return fail(err.msg);

    tk_tensor P[MAXP], G[MAXP], T[MAXP];
    float scale[MAXP];
    tk_optim_param ps[MAXP];
    memset(P, 0, sizeof P);
    memset(G, 0, sizeof G);
    memset(T, 0, sizeof T);
    int64_t total = 0;
    for (int i = 0; i < np; i++) {
        json_t *e = json_array_get(jp, (size_t)i);
        json_t *sh = json_object_get(e, "shape");
        int64_t shape[TK_MAX_DIMS];
        int nd = (int)json_array_size(sh);
        for (int k = 0; k < nd; k++)
            shape[k] = json_integer_value(json_array_get(sh, (size_t)k));
        const char *name = json_string_value(json_object_get(e, "name"));
        scale[i] = (float)json_number_value(json_object_get(e, "scale"));
        if (tk_tensor_alloc(d, &P[i], TK_F32, nd, shape, TK_CAT_PARAM, name, &err) ||
            tk_tensor_alloc(d, &G[i], TK_F32, nd, shape, TK_CAT_GRAD, name, &err) ||
            tk_tensor_alloc(d, &T[i], TK_F32, nd, shape, TK_CAT_INPUT, name, &err))
            return fail(err.msg);
        ps[i] = (tk_optim_param){ .name = name, .param = &P[i], .grad = &G[i],
                                  .no_decay = (int)json_integer_value(json_object_get(e, "no_decay")) };
        total += tk_tensor_numel(&P[i]);
    }
    float *host = malloc((size_t)total * 2 * sizeof(float));
    FILE *f = fopen(json_string_value(json_object_get(spec, "in")), "rb");
    if (!host || !f || fread(host, sizeof(float), (size_t)total * 2, f) != (size_t)total * 2)
        return fail("cannot read the input weights");
    fclose(f);
    int64_t off = 0;
    for (int i = 0; i < np; i++) {
        tk_tensor_write(d, &P[i], host + off, &err);
        tk_tensor_write(d, &T[i], host + total + off, &err);
        off += tk_tensor_numel(&P[i]);
    }

    tk_adamw *opt = tk_adamw_new(d, &c, ps, np, &err);
    if (!opt)
        return fail(err.msg);
    tk_sched sched = tk_sched_from_config(&c, steps);
    float lrs[256], norms[256];
    for (int s = 0; s < steps && s < 256; s++) {
        for (int i = 0; i < np; i++) {
            int64_t n = tk_tensor_numel(&P[i]);
            /* G = s_i * (P - T) */
            if (tk_op_fill(d, &G[i], 0.0f, n) || tk_op_axpby(d, &G[i], scale[i], &P[i], 0.0f, n) ||
                tk_op_axpby(d, &G[i], -scale[i], &T[i], 1.0f, n))
                return fail("gradient ops failed");
        }
        lrs[s] = tk_sched_lr(&sched, s);
        int skipped = 0;
        if (tk_adamw_step(opt, lrs[s], 1.0f, &norms[s], &skipped, &err) != TK_OK)
            return fail(err.msg);
    }
    off = 0;
    for (int i = 0; i < np; i++) {
        tk_tensor_read(d, &P[i], host + off, &err);
        off += tk_tensor_numel(&P[i]);
    }
    f = fopen(json_string_value(json_object_get(spec, "out")), "wb");
    if (!f || fwrite(host, sizeof(float), (size_t)total, f) != (size_t)total ||
        fwrite(lrs, sizeof(float), (size_t)steps, f) != (size_t)steps ||
        fwrite(norms, sizeof(float), (size_t)steps, f) != (size_t)steps)
        return fail("cannot write the output");
    fclose(f);
    tk_adamw_destroy(&opt);
    for (int i = 0; i < np; i++) {
        tk_tensor_free(d, &P[i]);
        tk_tensor_free(d, &G[i]);
        tk_tensor_free(d, &T[i]);
    }
    free(host);
    tk_dev_destroy(&d);
    json_decref(spec);
    return 0;
}
