// Writes ggml's reference quantization of a fixed input for every type we
// implement, for crates/kernels/tests/fixtures/ggml-quants.gguf (see
// make-quant-fixtures.sh). Output: a flat binary read by pack_fixtures.py:
//   u32 n_types; per type: u32 type id, u32 n_elements, u32 n_bytes,
//   bytes (quantized), f32[n_elements] (ggml's dequantization of them).
#include "ggml.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define N_PER_ROW 512
#define N_ROWS 4

static float input[N_PER_ROW * N_ROWS];

static void make_input(void) {
    // Deterministic, with the shapes that stress quantizers: smooth values,
    // outliers, an all-zero block, tiny values, sign flips.
    uint32_t s = 12345;
    for (int i = 0; i < N_PER_ROW * N_ROWS; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f - 0.5f;
        input[i] = 2.0f * u + 0.3f * cosf(0.05f * (float)i);
        if (i % 97 == 0) input[i] *= 12.0f;
    }
    for (int i = 256; i < 512; i++) input[i] = 0.0f;            // one zero super-block
    for (int i = 512; i < 544; i++) input[i] = 1e-6f * (float)(i - 528);
    for (int i = 544; i < 576; i++) input[i] = (i % 2) ? 3.0f : -3.0f;
}

int main(int argc, char ** argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s OUT\n", argv[0]); return 2; }
    make_input();
    const enum ggml_type types[] = {
        GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
        GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
        GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0,
    };
    const uint32_t n_types = sizeof(types) / sizeof(types[0]);
    const uint32_t n = N_PER_ROW * N_ROWS;
    FILE * f = fopen(argv[1], "wb");
    if (!f) { perror(argv[1]); return 1; }
    fwrite(&n_types, 4, 1, f);
    fwrite(input, 4, n, f);
    ggml_quantize_init(GGML_TYPE_COUNT);
    for (uint32_t t = 0; t < n_types; t++) {
        const enum ggml_type ty = types[t];
        const size_t row = ggml_row_size(ty, N_PER_ROW);
        uint8_t * q = malloc(row * N_ROWS);
        float * deq = malloc(sizeof(float) * n);
        size_t got = ggml_quantize_chunk(ty, input, q, 0, N_ROWS, N_PER_ROW, NULL);
        if (got != row * N_ROWS) { fprintf(stderr, "size mismatch for %s\n", ggml_type_name(ty)); return 1; }
        ggml_get_type_traits(ty)->to_float(q, deq, n);
        uint32_t id = (uint32_t)ty, nb = (uint32_t)got;
        fwrite(&id, 4, 1, f);
        fwrite(&n, 4, 1, f);
        fwrite(&nb, 4, 1, f);
        fwrite(q, 1, got, f);
        fwrite(deq, 4, n, f);
        free(q);
        free(deq);
    }
    fclose(f);
    return 0;
}
