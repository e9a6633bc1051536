/* test_profile.c — byte sizes in text (parse and PyTorch-style format), the
 * GPU profile table, dtype names, status names and the fp16/bf16 conversions
 * (every fp16 and bf16 value round-trips; ties round to even). */
#include <stdint.h>
#include <string.h>

#include "tk_gpu.h"
#include "tk_test.h"

static void test_format_bytes(void) {
    char b[32];
    TK_CHECK_STR(tk_format_bytes(0, b, sizeof b), "0 bytes");
    TK_CHECK_STR(tk_format_bytes(512, b, sizeof b), "512 bytes");
    TK_CHECK_STR(tk_format_bytes(1024, b, sizeof b), "1024 bytes");
    TK_CHECK_STR(tk_format_bytes(1536, b, sizeof b), "1.50 KiB");
    TK_CHECK_STR(tk_format_bytes(24u << 20, b, sizeof b), "24.00 MiB");
    TK_CHECK_STR(tk_format_bytes((size_t)(7.43 * 1073741824.0), b, sizeof b), "7.43 GiB");
    TK_CHECK_STR(tk_format_bytes(9374208, b, sizeof b), "8.94 MiB");
    TK_CHECK_STR(tk_format_bytes((size_t)1 << 30, b, sizeof b), "1024.00 MiB");
    char small[6];
    tk_format_bytes((size_t)5 << 30, small, sizeof small); /* truncates, never overflows */
    TK_CHECK_EQ_INT(strlen(small), 5);
}

static void test_parse_bytes(void) {
    size_t v = 0;
    TK_CHECK(tk_parse_bytes("1234567", &v) == 0 && v == 1234567);
    TK_CHECK(tk_parse_bytes("7.43GiB", &v) == 0 && v == (size_t)(7.43 * 1073741824.0 + 0.5));
    TK_CHECK(tk_parse_bytes("15GB", &v) == 0 && v == 15000000000ull);
    TK_CHECK(tk_parse_bytes("800MiB", &v) == 0 && v == 800ull << 20);
    TK_CHECK(tk_parse_bytes(" 800 mib ", &v) == 0 && v == 800ull << 20);
    TK_CHECK(tk_parse_bytes("2k", &v) == 0 && v == 2000);
    TK_CHECK(tk_parse_bytes("1TiB", &v) == 0 && v == 1ull << 40);
    TK_CHECK(tk_parse_bytes("512B", &v) == 0 && v == 512);
    const char *bad[] = {"", "GiB", "-1GiB", "7.43 GiBs", "12 34", "1e400", "nan", "inf", "3 pages"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TK_CHECK_MSG(tk_parse_bytes(bad[i], &v) != 0, "accepted \"%s\"", bad[i]);
    TK_CHECK(tk_parse_bytes(NULL, &v) != 0);
    /* what format prints, parse reads back to within the printed precision */
    char b[32];
    tk_format_bytes(15837691904ull, b, sizeof b);
    TK_CHECK(tk_parse_bytes(b, &v) == 0);
    TK_CHECK_NEAR((double)v, 15837691904.0, 0.005 * 1073741824.0);
}

static void test_profiles(void) {
    const tk_gpu_profile *t4 = tk_gpu_profile_find("T4");
    TK_CHECK(t4 != NULL);
    if (t4) {
        TK_CHECK_STR(t4->name, "t4");
        TK_CHECK_EQ_INT(t4->cc_major, 7);
        TK_CHECK_EQ_INT(t4->cc_minor, 5);
        char b[32];
        TK_CHECK_STR(tk_format_bytes(t4->capacity, b, sizeof b), "14.75 GiB");
    }
    const char *names[] = {"t4", "t4x2", "k80", "p4", "p100", "v100-16", "l4", "a100-40", "a100-80", "h100-80",
                           "rtx-pro-6000"};
    const char *caps[] = {"14.75 GiB", "14.75 GiB", "11.17 GiB", "7.43 GiB", "15.90 GiB", "15.78 GiB", NULL, "39.59 GiB",
                          "79.15 GiB", NULL, "95.59 GiB"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const tk_gpu_profile *p = tk_gpu_profile_find(names[i]);
        TK_CHECK_MSG(p != NULL, "%s", names[i]);
        if (!p) continue;
        char b[32];
        if (caps[i]) TK_CHECK_STR(tk_format_bytes(p->capacity, b, sizeof b), caps[i]);
        TK_CHECK(p->context_overhead >= 300000000u && p->context_overhead <= 1300000000u);
        TK_CHECK(p->fp32_flops > 1e12 && p->fp16_flops >= p->fp32_flops && p->bf16_flops >= p->fp32_flops &&
                 p->bandwidth > 1e11);
        TK_CHECK(p->long_name && p->long_name[0]);
        TK_CHECK_EQ_INT(p->gpus, strcmp(names[i], "t4x2") ? 1 : 2); /* capacity is per card */
    }
    int n = 0;
    while (tk_gpu_profile_at(n)) n++;
    TK_CHECK_EQ_INT(n, 12);
    TK_CHECK(tk_gpu_profile_at(-1) == NULL);
    TK_CHECK(tk_gpu_profile_find("rtx9090") == NULL);
    TK_CHECK(tk_gpu_profile_find(NULL) == NULL);
}

/* The MFU denominators (issue 36): dense datasheet peaks by precision, each
 * with its source, and the profile a device's own name picks. */
static void test_peaks(void) {
    for (int i = 0; tk_gpu_profile_at(i); i++) {
        const tk_gpu_profile *p = tk_gpu_profile_at(i);
        TK_CHECK_MSG(p->tf32_flops >= p->fp32_flops && p->peak_source && p->peak_source[0], "%s", p->name);
        TK_CHECK(tk_gpu_profile_peak(p, "fp32") == p->fp32_flops);
        TK_CHECK(tk_gpu_profile_peak(p, "tf32") == p->tf32_flops);
        TK_CHECK(tk_gpu_profile_peak(p, "bf16") == p->bf16_flops);
    }
    const tk_gpu_profile *h200 = tk_gpu_profile_by_device("NVIDIA H200");
    TK_CHECK(h200 && !strcmp(h200->name, "h200"));
    TK_CHECK(h200 && tk_gpu_profile_peak(h200, "fp16") == 989.5e12 && tk_gpu_profile_peak(h200, "tf32") == 494.5e12);
    const tk_gpu_profile *t4 = tk_gpu_profile_by_device("Tesla T4");
    TK_CHECK(t4 && !strcmp(t4->name, "t4") && t4->tf32_flops == t4->fp32_flops); /* Turing: no TF32 */
    TK_CHECK(tk_gpu_profile_by_device("NVIDIA H100 80GB HBM3") == tk_gpu_profile_find("h100-80"));
    TK_CHECK(tk_gpu_profile_by_device("NVIDIA H200 NVL") == NULL); /* not the SXM's clocks */
    TK_CHECK(tk_gpu_profile_by_device("NVIDIA L40S") == NULL);
    TK_CHECK(tk_gpu_profile_by_device(NULL) == NULL);
    TK_CHECK(tk_gpu_profile_peak(t4, "fp8") == 0);
}

static void test_names(void) {
    TK_CHECK_EQ_INT(tk_dtype_size(TK_BF16), 2);
    TK_CHECK_EQ_INT(tk_dtype_size(TK_I64), 8);
    TK_CHECK_EQ_INT(tk_dtype_size((tk_dtype)99), 0);
    tk_dtype dt;
    for (int i = 0; i < TK_DTYPE_COUNT; i++)
        TK_CHECK(tk_dtype_parse(tk_dtype_name((tk_dtype)i), &dt) == 0 && dt == (tk_dtype)i);
    TK_CHECK(tk_dtype_parse("bfloat16", &dt) == 0 && dt == TK_BF16);
    TK_CHECK(tk_dtype_parse("F16", &dt) == 0 && dt == TK_F16);
    TK_CHECK(tk_dtype_parse("f8", &dt) != 0);
    TK_CHECK_STR(tk_cat_name(TK_CAT_WORKSPACE), "workspace");
    TK_CHECK_STR(tk_cat_name((tk_cat)42), "?");
    TK_CHECK_STR(tk_status_name(TK_EOOM), "out of memory");
    tk_err e = {0};
    tk_err_set(&e, TK_EFORMAT, "line %d: %s", 3, "bad");
    TK_CHECK(e.status == TK_EFORMAT);
    TK_CHECK_STR(e.msg, "line 3: bad");
    tk_err_set(NULL, TK_EIO, "ignored");
}

static float f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

static void test_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = tk_f16_to_f32((uint16_t)h);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan) { if (x == x) bad++; if ((tk_f32_to_f16(x) & 0x7fff) <= 0x7c00) bad++; continue; }
        if (tk_f32_to_f16(x) != h) bad++;
    }
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK(tk_f16_to_f32(0x3c00) == 1.0f);
    TK_CHECK(tk_f16_to_f32(0x0001) == 5.9604644775390625e-08f); /* smallest subnormal */
    TK_CHECK_EQ_INT(tk_f32_to_f16(65504.0f), 0x7bff);
    TK_CHECK_EQ_INT(tk_f32_to_f16(65519.0f), 0x7bff);
    TK_CHECK_EQ_INT(tk_f32_to_f16(65520.0f), 0x7c00); /* ties to even: overflow */
    TK_CHECK_EQ_INT(tk_f32_to_f16(1e9f), 0x7c00);
    TK_CHECK_EQ_INT(tk_f32_to_f16(-0.0f), 0x8000);
    /* 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1) */
    TK_CHECK_EQ_INT(tk_f32_to_f16(1.0f + 0.00048828125f), 0x3c00);
    /* 1 + 3*2^-11 is halfway between 1+2^-10 and 1+2^-9: to even (1+2^-9) */
    TK_CHECK_EQ_INT(tk_f32_to_f16(1.0f + 3 * 0.00048828125f), 0x3c02);
    TK_CHECK_EQ_INT(tk_f32_to_f16(2.98023223876953125e-08f), 0x0000); /* 2^-25: tie to 0 */
    TK_CHECK_EQ_INT(tk_f32_to_f16(2.99e-08f), 0x0001);
    TK_CHECK_EQ_INT(tk_f32_to_f16(f(0x387fe000u)), 0x0400); /* rounds up into the normals */
}

static void test_bf16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = tk_bf16_to_f32((uint16_t)h);
        if (x != x) { if ((tk_f32_to_bf16(x) & 0x7fff) <= 0x7f80) bad++; continue; }
        if (tk_f32_to_bf16(x) != h) bad++;
    }
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK_EQ_INT(tk_f32_to_bf16(f(0x3f808000u)), 0x3f80); /* tie, even stays */
    TK_CHECK_EQ_INT(tk_f32_to_bf16(f(0x3f818000u)), 0x3f82); /* tie, odd rounds up */
    TK_CHECK_EQ_INT(tk_f32_to_bf16(f(0x3f808001u)), 0x3f81);
    TK_CHECK_EQ_INT(tk_f32_to_bf16(f(0x7f7fffffu)), 0x7f80); /* max float rounds to inf */
    TK_CHECK((tk_f32_to_bf16(f(0x7f800001u)) & 0x7f) != 0);  /* signalling NaN stays NaN */
}

int main(void) {
    TK_RUN(test_format_bytes);
    TK_RUN(test_parse_bytes);
    TK_RUN(test_profiles);
    TK_RUN(test_peaks);
    TK_RUN(test_names);
    TK_RUN(test_f16);
    TK_RUN(test_bf16);
    return tk_test_done();
}
