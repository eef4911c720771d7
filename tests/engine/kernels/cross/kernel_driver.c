/*
 * Runs one kernel of inference/engine/kernels/csrc/ on arrays read from files: the program the
 * cross-compiled tests (tests/engine/kernels/test_cross_aarch64.py) run under qemu-aarch64,
 * where the kernels cannot be loaded into the test's own (x86-64) Python process.
 *
 *   kernel_driver KERNEL DIR [NAME=VALUE ...]
 *
 * KERNEL: rms_norm, silu_and_mul, rotary_store, int4_linear, int4_dequantize, int8_linear,
 * int8_dequantize, paged_decode_attention, paged_prefill_attention or decode_layers. NAME=VALUE: the kernel's sizes and
 * float parameters (C syntax: strtod, so Python's float.hex() passes a value exactly) and
 * `threads`.
 *
 * Each array argument NAME is read from the file DIR/NAME (raw bytes, the machine's byte
 * order; act_t arrays in this build's activation type); its size must be exactly what the sizes
 * imply. Outputs, and the arrays a kernel updates in place, are written to DIR/NAME.out; an
 * output the kernel does not write reads back as NaN (the buffers start as all-ones bytes).
 *
 * The kernel's return status is printed on stdout. Exit status: 0 when the kernel ran (whatever
 * it returned), 2 for a usage or file error, or for indices that would make the kernel read or
 * write out of bounds.
 *
 * decode_layers.c is included rather than linked, so the descriptors built here are its own
 * types (model_desc, layer_desc, linear_desc): a field renamed there fails to compile here.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "decode_layers.c"

static const char *array_dir;
static int num_scalars;
static char **scalar_args;

static void fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("kernel_driver: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(2);
}

static const char *scalar(const char *name) {
    const size_t length = strlen(name);
    for (int i = 0; i < num_scalars; ++i)
        if (!strncmp(scalar_args[i], name, length) && scalar_args[i][length] == '=')
            return scalar_args[i] + length + 1;
    fail("missing argument %s=", name);
    return NULL;
}

static int64_t int_arg(const char *name) {
    const char *text = scalar(name);
    char *end;
    const long long value = strtoll(text, &end, 10);
    if (*text == '\0' || *end != '\0') fail("%s=%s is not an integer", name, text);
    return (int64_t)value;
}

/* a size: positive, and small enough that a product of four stays within int64 */
static int64_t size_arg(const char *name) {
    const int64_t value = int_arg(name);
    if (value < 1 || value > (1 << 15)) fail("%s=%lld is out of range", name, (long long)value);
    return value;
}

static float float_arg(const char *name) {
    const char *text = scalar(name);
    char *end;
    const double value = strtod(text, &end);
    if (*text == '\0' || *end != '\0') fail("%s=%s is not a number", name, text);
    return (float)value;
}

static void path_of(char *path, size_t size, const char *name, const char *suffix) {
    if ((size_t)snprintf(path, size, "%s/%s%s", array_dir, name, suffix) >= size)
        fail("path too long for %s", name);
}

/* The array NAME, which must hold exactly `bytes` bytes; NULL when it is optional and absent. */
static void *read_array(const char *name, size_t bytes, int optional) {
    char path[4096];
    path_of(path, sizeof path, name, "");
    FILE *file = fopen(path, "rb");
    if (!file) {
        if (optional) return NULL;
        fail("cannot open %s", path);
    }
    void *data = malloc(bytes ? bytes : 1);
    if (!data) fail("out of memory for %s", name);
    const size_t got = fread(data, 1, bytes, file);
    const int trailing = fgetc(file) != EOF;
    fclose(file);
    if (got != bytes || trailing) fail("%s does not hold %zu bytes", path, bytes);
    return data;
}

static void *need(const char *name, size_t bytes) { return read_array(name, bytes, 0); }
static void *maybe(const char *name, size_t bytes) { return read_array(name, bytes, 1); }

/* An output buffer, every byte 0xff: NaN in bf16 and float32. */
static void *fresh(size_t bytes) {
    void *data = malloc(bytes ? bytes : 1);
    if (!data) fail("out of memory");
    memset(data, 0xff, bytes);
    return data;
}

static void put(const char *name, const void *data, size_t bytes) {
    char path[4096];
    path_of(path, sizeof path, name, ".out");
    FILE *file = fopen(path, "wb");
    if (!file || fwrite(data, 1, bytes, file) != bytes || fclose(file))
        fail("cannot write %s", path);
}

static size_t acts(int64_t count) { return sizeof(act_t) * (size_t)count; }
static size_t floats(int64_t count) { return sizeof(float) * (size_t)count; }

static void check_indices_64(const int64_t *index, int64_t count, int64_t limit, const char *what) {
    for (int64_t i = 0; i < count; ++i)
        if (index[i] < 0 || index[i] >= limit)
            fail("%s[%lld] = %lld is outside [0, %lld)", what, (long long)i, (long long)index[i],
                 (long long)limit);
}

static void check_indices_32(const int32_t *index, int64_t count, int64_t limit, const char *what) {
    for (int64_t i = 0; i < count; ++i)
        if (index[i] < 0 || index[i] >= limit)
            fail("%s[%lld] = %d is outside [0, %lld)", what, (long long)i, index[i],
                 (long long)limit);
}

static void check_context(const int32_t *context_lens, int64_t num_seqs, int64_t table_stride,
                          int64_t block_size) {
    for (int64_t s = 0; s < num_seqs; ++s)
        if (context_lens[s] < 1 || context_lens[s] > table_stride * block_size)
            fail("context_lens[%lld] = %d does not fit a table of %lld blocks", (long long)s,
                 context_lens[s], (long long)table_stride);
}

static int run_rms_norm(int threads) {
    const int64_t rows = size_arg("rows"), hidden = size_arg("hidden");
    const act_t *x = need("x", acts(rows * hidden));
    act_t *residual = maybe("residual", acts(rows * hidden));
    const act_t *weight = need("weight", acts(hidden));
    act_t *out = fresh(acts(rows * hidden));
    const int status =
        add_rms_norm(x, residual, weight, out, rows, hidden, float_arg("eps"), threads);
    put("out", out, acts(rows * hidden));
    if (residual) put("residual", residual, acts(rows * hidden));
    return status;
}

static int run_silu_and_mul(int threads) {
    const int64_t rows = size_arg("rows"), width = size_arg("width");
    const act_t *gate_up = need("gate_up", acts(rows * 2 * width));
    act_t *out = fresh(acts(rows * width));
    const int status = silu_and_mul(gate_up, out, rows, width, threads);
    put("out", out, acts(rows * width));
    return status;
}

static int run_rotary_store(int threads) {
    const int64_t tokens = size_arg("tokens"), num_heads = size_arg("num_heads");
    const int64_t num_kv_heads = size_arg("num_kv_heads"), head_dim = size_arg("head_dim");
    const int64_t cache_rows = size_arg("cache_rows"); /* the caches viewed as [-1, head_dim] */
    const act_t *qkv = need("qkv", acts(tokens * (num_heads + 2 * num_kv_heads) * head_dim));
    const act_t *cos = need("cos", acts(tokens * head_dim));
    const act_t *sin = need("sin", acts(tokens * head_dim));
    act_t *k_cache = need("k_cache", acts(cache_rows * head_dim));
    act_t *v_cache = need("v_cache", acts(cache_rows * head_dim));
    const int64_t *write_index = need("write_index", sizeof(int64_t) * tokens * num_kv_heads);
    check_indices_64(write_index, tokens * num_kv_heads, cache_rows, "write_index");
    act_t *q_out = fresh(acts(tokens * num_heads * head_dim));
    act_t *k_out = fresh(acts(tokens * num_kv_heads * head_dim));
    const int status = rotary_store(qkv, cos, sin, k_cache, v_cache, write_index, q_out, k_out,
                                    tokens, num_heads, num_kv_heads, head_dim, threads);
    put("q_out", q_out, acts(tokens * num_heads * head_dim));
    put("k_out", k_out, acts(tokens * num_kv_heads * head_dim));
    put("k_cache", k_cache, acts(cache_rows * head_dim));
    put("v_cache", v_cache, acts(cache_rows * head_dim));
    return status;
}

/* An int4 weight's arrays: NAME.codes, NAME.scales, NAME.zero_points (int4_linear.c's layout,
 * whose shape checks the kernel makes itself: here only the sizes of the files). */
typedef struct {
    const uint8_t *codes;
    const uint16_t *scales;
    const uint8_t *zero_points;
} int4_weight;

static int4_weight read_int4_weight(const char *name, int64_t padded_n, int64_t k,
                                    int64_t group_size) {
    char part[256];
    int4_weight weight;
    const size_t groups = (size_t)(padded_n * (k / group_size));
    snprintf(part, sizeof part, "%s.codes", name);
    weight.codes = need(part, (size_t)(padded_n * k / 2));
    snprintf(part, sizeof part, "%s.scales", name);
    weight.scales = need(part, sizeof(uint16_t) * groups);
    snprintf(part, sizeof part, "%s.zero_points", name);
    weight.zero_points = need(part, groups);
    return weight;
}

static int run_int4_linear(int threads) {
    const int64_t m = size_arg("m"), n = size_arg("n"), padded_n = size_arg("padded_n");
    const int64_t k = size_arg("k"), group_size = size_arg("group_size");
    if (k % 2) fail("k=%lld is odd", (long long)k);
    const act_t *x = need("x", acts(m * k));
    const int4_weight weight = read_int4_weight("weight", padded_n, k, group_size);
    act_t *out = fresh(acts(m * n));
    const int status = int4_linear(x, weight.codes, weight.scales, weight.zero_points, out, m, n,
                                   padded_n, k, group_size, threads);
    put("out", out, acts(m * n));
    return status;
}

static int run_int4_dequantize(int threads) {
    const int64_t row0 = size_arg("row0"), num_rows = size_arg("num_rows");
    const int64_t padded_n = size_arg("padded_n"), k = size_arg("k");
    const int64_t group_size = size_arg("group_size");
    const int4_weight weight = read_int4_weight("weight", padded_n, k, group_size);
    act_t *out = fresh(acts(k * num_rows));
    const int status = int4_dequantize(weight.codes, weight.scales, weight.zero_points, out,
                                       row0, num_rows, padded_n, k, group_size, threads);
    put("out", out, acts(k * num_rows));
    return status;
}

/* An int8 weight's arrays: NAME.codes (int8_linear.c's layout), NAME.scales (act_t). */
typedef struct {
    const int8_t *codes;
    const act_t *scales;
} int8_weight;

static int8_weight read_int8_weight(const char *name, int64_t padded_n, int64_t k) {
    char part[256];
    int8_weight weight;
    snprintf(part, sizeof part, "%s.codes", name);
    weight.codes = need(part, (size_t)(padded_n * k));
    snprintf(part, sizeof part, "%s.scales", name);
    weight.scales = need(part, acts(padded_n));
    return weight;
}

static int run_int8_dequantize(int threads) {
    const int64_t row0 = size_arg("row0"), num_rows = size_arg("num_rows");
    const int64_t padded_n = size_arg("padded_n"), k = size_arg("k");
    const int8_weight weight = read_int8_weight("weight", padded_n, k);
    act_t *out = fresh(acts(k * num_rows));
    const int status =
        int8_dequantize(weight.codes, weight.scales, out, row0, num_rows, padded_n, k, threads);
    put("out", out, acts(k * num_rows));
    return status;
}

static int run_int8_linear(int threads) {
    const int64_t m = size_arg("m"), n = size_arg("n"), padded_n = size_arg("padded_n");
    const int64_t k = size_arg("k");
    const act_t *x = need("x", acts(m * k));
    const int8_weight weight = read_int8_weight("weight", padded_n, k);
    act_t *out = fresh(acts(m * n));
    const int status =
        int8_linear(x, weight.codes, weight.scales, out, m, n, padded_n, k, threads);
    put("out", out, acts(m * n));
    return status;
}

static int run_paged_decode_attention(int threads) {
    const int64_t num_seqs = size_arg("num_seqs"), num_kv_heads = size_arg("num_kv_heads");
    const int64_t group = size_arg("group"), head_dim = size_arg("head_dim");
    const int64_t block_size = size_arg("block_size"), num_blocks = size_arg("num_blocks");
    const int64_t table_stride = size_arg("table_stride");
    const int64_t tokens_per_part = size_arg("tokens_per_part"), num_parts = size_arg("num_parts");
    const int64_t cache = num_blocks * num_kv_heads * block_size * head_dim;
    const int64_t heads = num_seqs * num_kv_heads * group;
    const act_t *q = need("q", acts(heads * head_dim));
    const act_t *k_cache = need("k_cache", acts(cache));
    const act_t *v_cache = need("v_cache", acts(cache));
    const int32_t *block_tables = need("block_tables", sizeof(int32_t) * num_seqs * table_stride);
    const int32_t *context_lens = need("context_lens", sizeof(int32_t) * num_seqs);
    check_indices_32(block_tables, num_seqs * table_stride, num_blocks, "block_tables");
    check_context(context_lens, num_seqs, table_stride, block_size);
    float *out = fresh(floats(heads * head_dim));
    float *lse = fresh(floats(heads));
    float *scratch = fresh(floats(num_seqs * num_kv_heads * num_parts * group * (head_dim + 2)));
    const int status = paged_decode_attention(
        q, k_cache, v_cache, block_tables, table_stride, context_lens, num_seqs, num_kv_heads,
        group, head_dim, block_size, float_arg("scale"), tokens_per_part, num_parts, out, lse,
        scratch, threads);
    put("out", out, floats(heads * head_dim));
    put("lse", lse, floats(heads));
    return status;
}

static int run_paged_prefill_attention(int threads) {
    const int64_t num_tokens = size_arg("num_tokens"), num_kv_heads = size_arg("num_kv_heads");
    const int64_t group = size_arg("group"), head_dim = size_arg("head_dim");
    const int64_t block_size = size_arg("block_size"), num_blocks = size_arg("num_blocks");
    const int64_t table_len = size_arg("table_len");
    const int64_t cache = num_blocks * num_kv_heads * block_size * head_dim;
    const int64_t token_stride = num_kv_heads * group * head_dim;
    const act_t *q = need("q", acts(num_tokens * token_stride));
    const act_t *k_cache = need("k_cache", acts(cache));
    const act_t *v_cache = need("v_cache", acts(cache));
    const int32_t *block_table = need("block_table", sizeof(int32_t) * table_len);
    const int32_t *positions = need("positions", sizeof(int32_t) * num_tokens);
    check_indices_32(block_table, table_len, num_blocks, "block_table");
    check_indices_32(positions, num_tokens, table_len * block_size, "positions");
    act_t *out = fresh(acts(num_tokens * token_stride));
    const int status = paged_prefill_attention(
        q, token_stride, k_cache, v_cache, block_table, positions, num_tokens, num_kv_heads, group,
        head_dim, block_size, float_arg("scale"), size_arg("tokens_per_item"), out, token_stride,
        threads);
    put("out", out, acts(num_tokens * token_stride));
    return status;
}

/* The linear layer LAYER.NAME: int4 when its NAME.zero_points file exists, int8 otherwise. */
static linear_desc linear_layer_desc(const char *layer, const char *name, int64_t out_features,
                                     int64_t in_features, int64_t group_size) {
    char prefix[128], part[160];
    snprintf(prefix, sizeof prefix, "%s.%s", layer, name);
    const int64_t padded = (out_features + 63) / 64 * 64;
    snprintf(part, sizeof part, "%s.bias", prefix);
    linear_desc desc = {
        .out_features = out_features,
        .padded_out_features = padded,
        .in_features = in_features,
        .group_size = group_size,
        .bias = maybe(part, acts(out_features)),
    };
    snprintf(part, sizeof part, "%s/%s.zero_points", array_dir, prefix);
    FILE *zero_points = fopen(part, "rb");
    if (zero_points) {
        fclose(zero_points);
        const int4_weight weight = read_int4_weight(prefix, padded, in_features, group_size);
        desc.kind = LINEAR_INT4;
        desc.weight = weight.codes;
        desc.scales = weight.scales;
        desc.zero_points = weight.zero_points;
    } else {
        const int8_weight weight = read_int8_weight(prefix, padded, in_features);
        desc.kind = LINEAR_INT8;
        desc.weight = weight.codes;
        desc.scales = weight.scales;
    }
    return desc;
}

/* A decode step of a Llama model whose linear layers are int4 or int8 (as on every CPU without
 * AMX). Per layer L: L.input_norm, L.post_norm, the weights of L.{qkv,o,gate_up,down} (int4:
 * .codes, .scales, .zero_points; int8: .codes, .scales) and optional L.<linear>.bias, L.k_cache
 * and L.v_cache (written back). */
static int run_decode_layers(int threads) {
    model_desc model = {
        .num_layers = size_arg("num_layers"),
        .hidden = size_arg("hidden"),
        .num_heads = size_arg("num_heads"),
        .num_kv_heads = size_arg("num_kv_heads"),
        .head_dim = size_arg("head_dim"),
        .intermediate = size_arg("intermediate"),
        .block_size = size_arg("block_size"),
        .eps = float_arg("eps"),
        .scale = float_arg("scale"),
    };
    const int64_t group_size = size_arg("group_size"), num_blocks = size_arg("num_blocks");
    const int64_t m = size_arg("m"), table_stride = size_arg("table_stride");
    const int64_t tokens_per_part = size_arg("tokens_per_part"), num_parts = size_arg("num_parts");
    const int64_t hidden = model.hidden, head_dim = model.head_dim;
    const int64_t q_size = model.num_heads * head_dim, kv_size = model.num_kv_heads * head_dim;
    const int64_t cache = num_blocks * model.num_kv_heads * model.block_size * head_dim;

    act_t *x = need("x", acts(m * hidden));
    const act_t *cos = need("cos", acts(m * head_dim));
    const act_t *sin = need("sin", acts(m * head_dim));
    const int64_t *write_index = need("write_index", sizeof(int64_t) * m * model.num_kv_heads);
    const int32_t *block_tables = need("block_tables", sizeof(int32_t) * m * table_stride);
    const int32_t *context_lens = need("context_lens", sizeof(int32_t) * m);
    check_indices_64(write_index, m * model.num_kv_heads, cache / head_dim, "write_index");
    check_indices_32(block_tables, m * table_stride, num_blocks, "block_tables");
    check_context(context_lens, m, table_stride, model.block_size);

    layer_desc *layers = calloc((size_t)model.num_layers, sizeof(layer_desc));
    if (!layers) fail("out of memory");
    for (int64_t l = 0; l < model.num_layers; ++l) {
        char name[64], part[96];
        snprintf(name, sizeof name, "%lld", (long long)l);
        layer_desc *layer = layers + l;
        snprintf(part, sizeof part, "%s.input_norm", name);
        layer->input_norm = need(part, acts(hidden));
        snprintf(part, sizeof part, "%s.post_norm", name);
        layer->post_norm = need(part, acts(hidden));
        layer->qkv = linear_layer_desc(name, "qkv", q_size + 2 * kv_size, hidden, group_size);
        layer->o = linear_layer_desc(name, "o", hidden, q_size, group_size);
        layer->gate_up =
            linear_layer_desc(name, "gate_up", 2 * model.intermediate, hidden, group_size);
        layer->down = linear_layer_desc(name, "down", hidden, model.intermediate, group_size);
        snprintf(part, sizeof part, "%s.k_cache", name);
        layer->k_cache = need(part, acts(cache));
        snprintf(part, sizeof part, "%s.v_cache", name);
        layer->v_cache = need(part, acts(cache));
    }

    act_t *residual = fresh(acts(m * hidden));
    const int status = decode_layers(&model, layers, x, residual, cos, sin, write_index,
                                     block_tables, table_stride, context_lens, NULL, 0, m,
                                     tokens_per_part, num_parts, threads);
    put("x", x, acts(m * hidden));
    put("residual", residual, acts(m * hidden));
    for (int64_t l = 0; l < model.num_layers; ++l) {
        char part[96];
        snprintf(part, sizeof part, "%lld.k_cache", (long long)l);
        put(part, layers[l].k_cache, acts(cache));
        snprintf(part, sizeof part, "%lld.v_cache", (long long)l);
        put(part, layers[l].v_cache, acts(cache));
    }
    return status;
}

int main(int argc, char **argv) {
    if (argc < 3) fail("usage: kernel_driver KERNEL DIR [NAME=VALUE ...]");
    const char *kernel = argv[1];
    array_dir = argv[2];
    num_scalars = argc - 3;
    scalar_args = argv + 3;
    const int threads = (int)size_arg("threads");
    int status;
    if (!strcmp(kernel, "rms_norm"))
        status = run_rms_norm(threads);
    else if (!strcmp(kernel, "silu_and_mul"))
        status = run_silu_and_mul(threads);
    else if (!strcmp(kernel, "rotary_store"))
        status = run_rotary_store(threads);
    else if (!strcmp(kernel, "int4_linear"))
        status = run_int4_linear(threads);
    else if (!strcmp(kernel, "int4_dequantize"))
        status = run_int4_dequantize(threads);
    else if (!strcmp(kernel, "int8_dequantize"))
        status = run_int8_dequantize(threads);
    else if (!strcmp(kernel, "int8_linear"))
        status = run_int8_linear(threads);
    else if (!strcmp(kernel, "paged_decode_attention"))
        status = run_paged_decode_attention(threads);
    else if (!strcmp(kernel, "paged_prefill_attention"))
        status = run_paged_prefill_attention(threads);
    else if (!strcmp(kernel, "decode_layers"))
        status = run_decode_layers(threads);
    else
        fail("unknown kernel %s", kernel);
    printf("%d\n", status);
    return 0;
}
