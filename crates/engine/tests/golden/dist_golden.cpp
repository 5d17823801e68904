// Generates the goldens in tests/sample.rs (uniform_draws_match_libstdcpp,
// draws_match_llama_cpp_dist_for_a_seed): g++ -O2 dist_golden.cpp && ./a.out
// The dist() loop is llama_sampler_dist_apply from llama.cpp src/llama-sampler.cpp.
#include <cstring>
#include <random>
#include <cstdio>
#include <cmath>
#include <vector>
struct td { int id; float logit; float p; };
// verbatim logic of llama_sampler_dist_apply (sorted candidates)
int dist(std::vector<td>& c, std::mt19937& rng) {
    std::uniform_real_distribution<double> dist(0.0f, 1.0f);
    if (c.size()==1) { dist(rng); return c[0].id; }
    float max_l = c[0].logit;
    double sum_cum = 0.0f;
    for (auto& t : c) { float p = expf(t.logit - max_l); t.p = p; sum_cum += p; }
    const double rnd = dist(rng);
    double sum_run = 0.0f; const double sum_tgt = sum_cum*rnd;
    for (size_t i=0;i<c.size();++i){ sum_run += c[i].p; if (sum_run >= sum_tgt) return c[i].id; }
    return c.back().id;
}
int main(){
    {
        std::mt19937 rng(42);
        std::uniform_real_distribution<double> d(0.0f, 1.0f);
        for (int i=0;i<4;i++) {double x=d(rng); unsigned long long b; memcpy(&b,&x,8); printf("0x%016llx\n", b);}
    }
    // candidates sorted by logit desc, as after top-k; temp 0.8 applied
    std::mt19937 rng(1234);
    float logits[6] = {2.5f, 2.0f, 1.25f, 0.5f, -1.0f, -3.0f};
    int ids[6] = {7, 3, 0, 5, 1, 9};
    for (int it=0; it<32; it++) {
        std::vector<td> c;
        for (int i=0;i<6;i++) c.push_back({ids[i], logits[i]/0.8f, 0});
        printf("%d,", dist(c, rng));
    }
    printf("\n");
}
