// dump_logits: reference logits from llama.cpp for cachefit's forward-pass
// fixtures (see make-logit-fixtures.sh and crates/model/tests/fixtures/).
//
//   dump_logits MODEL.gguf PROMPT_FILE PARSE_SPECIAL(0|1) [N_POS=64] [N_GREEDY=32] [--ids] [--n-ctx N]
//
// PROMPT_FILE holds the prompt's exact bytes. Prints one JSON object on stdout.
// Settings: n_ctx = n_batch = n_ubatch = 512 (or N with --n-ctx N), n_threads =
// n_threads_batch = 1, flash attention off, K/V cache F32, one sequence.
// --ids: PROMPT_FILE holds the prompt as decimal token ids (separated by
// whitespace or commas), used as is: no tokenization, no BOS added,
// PARSE_SPECIAL ignored (make-arch-fixtures.py). Without the flags the
// behaviour and output are exactly as before.
//  1. Tokenize with llama_tokenize(add_special = true, so BOS/EOS only as the
//     model's metadata says; parse_special as given).
//  2. Greedy: decode the prompt as one batch, then one token per decode,
//     taking the argmax (lowest id on ties; no stop at end-of-generation
//     tokens) for max(N_GREEDY, N_POS - n_prompt) steps. Records the first
//     N_GREEDY ids and, per step, top1 - top2 logit.
//  3. tokens = prompt tokens + greedy tokens, cut to N_POS. Clear the cache and
//     decode all N_POS tokens as ONE batch (positions 0..N_POS-1, logits for
//     every position); record the top 20 (id, logit) per position, logit
//     descending, ties by lower id. Logits printed with 5 significant digits.
//     Also prints the largest |logit| difference (whole vocabulary, and over
//     the batch's top 20 ids) between this batch and step 2's one-token
//     decodes at the positions both cover.
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

static std::string json_str(const std::string & s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"') o += "\\\"";
        else if (c == '\\') o += "\\\\";
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
        else o += (char) c;
    }
    return o + "\"";
}

static std::vector<int> topk(const float * l, int n, int k) {
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return l[a] > l[b] || (l[a] == l[b] && a < b);
    });
    idx.resize(k);
    return idx;
}

static void decode(llama_context * ctx, const std::vector<llama_token> & toks, int pos0, bool all_logits) {
    llama_batch b = llama_batch_init((int) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + (int) i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i + 1 == toks.size();
    }
    b.n_tokens = (int) toks.size();
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "llama_decode failed\n"); exit(1); }
    llama_batch_free(b);
}

int main(int argc, char ** argv) {
    // positional arguments, plus the optional flags --ids and --n-ctx N anywhere after them
    std::vector<char *> args;
    bool ids = false;
    int n_ctx = 512;
    for (int i = 0; i < argc; i++) {
        const std::string a = argv[i];
        if (i > 0 && a == "--ids") { ids = true; }
        else if (i > 0 && a == "--n-ctx" && i + 1 < argc) { n_ctx = atoi(argv[++i]); }
        else { args.push_back(argv[i]); }
    }
    argc = (int) args.size();
    argv = args.data();
    if (argc < 4 || n_ctx <= 0) { fprintf(stderr, "usage: %s MODEL PROMPT_FILE PARSE_SPECIAL [N_POS] [N_GREEDY] [--ids] [--n-ctx N]\n", argv[0]); return 2; }
    const int n_pos = argc > 4 ? atoi(argv[4]) : 64;
    const int n_greedy = argc > 5 ? atoi(argv[5]) : 32;
    const bool parse_special = atoi(argv[3]) != 0;
    std::ifstream f(argv[2], std::ios::binary);
    std::stringstream ss; ss << f.rdbuf();
    const std::string text = ss.str();

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx; cp.n_batch = n_ctx; cp.n_ubatch = n_ctx; cp.n_seq_max = 1;
    cp.n_threads = 1; cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create context\n"); return 1; }

    std::vector<llama_token> prompt;
    int n = 0;
    if (ids) {
        std::string t = text;
        std::replace(t.begin(), t.end(), ',', ' ');
        std::istringstream is(t);
        long id;
        while (is >> id) {
            if (id < 0 || id >= n_vocab) { fprintf(stderr, "token id %ld out of range (n_vocab %d)\n", id, n_vocab); return 1; }
            prompt.push_back((llama_token) id);
        }
        if (!is.eof()) { fprintf(stderr, "cannot parse token ids in %s\n", argv[2]); return 1; }
        n = (int) prompt.size();
    } else {
        prompt.resize(text.size() + 8);
        n = llama_tokenize(vocab, text.data(), (int) text.size(), prompt.data(), (int) prompt.size(), true, parse_special);
        if (n < 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
        prompt.resize(n);
    }
    if (n == 0 || n > n_pos) { fprintf(stderr, "prompt has %d tokens (need 1..%d)\n", n, n_pos); return 1; }

    // 2. greedy
    const int steps = std::max(n_greedy, n_pos - n);
    std::vector<llama_token> gen; std::vector<float> gap;
    std::vector<std::vector<float>> inc; // incremental logits at positions n-1 .. n_pos-2
    decode(ctx, prompt, 0, false);
    for (int s = 0; s < steps; s++) {
        const float * l = llama_get_logits_ith(ctx, -1);
        if (n - 1 + s < n_pos - 1) inc.emplace_back(l, l + n_vocab);
        auto t = topk(l, n_vocab, 2);
        gen.push_back(t[0]); gap.push_back(l[t[0]] - l[t[1]]);
        if (s + 1 < steps) decode(ctx, {t[0]}, n + s, false);
    }

    // 3. one batch of n_pos tokens
    std::vector<llama_token> toks(prompt);
    toks.insert(toks.end(), gen.begin(), gen.end());
    toks.resize(n_pos);
    llama_memory_clear(llama_get_memory(ctx), true);
    decode(ctx, toks, 0, true);

    // how far the one-batch logits are from the incremental (one token per
    // decode) logits at the same positions: llama.cpp's own noise floor.
    // Nonzero mostly because ggml quantizes activations to Q8 before each
    // quantized matmul: the f32 attention sums differ in the last bits between
    // the two paths, that sometimes flips one Q8 rounding, and SmolLM2's large
    // activations amplify it.
    float inc_diff = 0.0f, inc_diff20 = 0.0f;
    for (size_t k = 0; k < inc.size(); k++) {
        const float * l = llama_get_logits_ith(ctx, n - 1 + (int) k);
        for (int v = 0; v < n_vocab; v++) inc_diff = std::max(inc_diff, std::abs(l[v] - inc[k][v]));
        for (int v : topk(l, n_vocab, 20)) inc_diff20 = std::max(inc_diff20, std::abs(l[v] - inc[k][v]));
    }

    auto detok = [&](const std::vector<llama_token> & v) {
        std::string s;
        for (auto t : v) {
            char buf[256];
            int k = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, true);
            if (k > 0) s.append(buf, k);
        }
        return s;
    };
    char num[64];
    printf("{\"n_prompt\":%d,\"tokens\":[", n);
    for (int i = 0; i < n_pos; i++) printf("%s%d", i ? "," : "", toks[i]);
    printf("],\n\"top20\":[");
    for (int i = 0; i < n_pos; i++) {
        const float * l = llama_get_logits_ith(ctx, i);
        auto t = topk(l, n_vocab, 20);
        printf("%s\n[", i ? "," : "");
        for (int j = 0; j < 20; j++) { snprintf(num, sizeof num, "%.5g", l[t[j]]); printf("%s[%d,%s]", j ? "," : "", t[j], num); }
        printf("]");
    }
    printf("],\n\"greedy32\":[");
    for (int i = 0; i < n_greedy; i++) printf("%s%d", i ? "," : "", gen[i]);
    printf("],\n\"greedy_top2_gap\":[");
    for (int i = 0; i < n_greedy; i++) { snprintf(num, sizeof num, "%.5g", gap[i]); printf("%s%s", i ? "," : "", num); }
    snprintf(num, sizeof num, "%.5g", inc_diff);
    printf("],\n\"batch_vs_incremental_max_abs_diff\":%s", num);
    snprintf(num, sizeof num, "%.5g", inc_diff20);
    printf(",\n\"batch_vs_incremental_max_abs_diff_top20\":%s", num);
    printf(",\n\"greedy32_text\":%s}\n", json_str(detok(std::vector<llama_token>(gen.begin(), gen.begin() + n_greedy))).c_str());

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
