/* CPU emulation of the embedding backward's dwte fast path (kernels/embed.cu:
 * k_embed_tiles, k_embed_finish, emb_tile_len), to check its tile / piece /
 * run bookkeeping on a machine without a GPU (not a substitute for
 * tests/gpu/test_cuda_ops on a GPU). tests/gpu/embed_emu.sh extracts the
 * kernels and the dtype helpers of cuda_common.cuh into kern.inc.
 *
 * Each block runs as blockDim fibers (emu_cuda.h; __syncthreads is a
 * barrier); blocks run one at a time in a shuffled order, twice with
 * different orders (results must be bitwise equal). The (key, position)
 * sort is std::stable_sort, as cub's stable radix sort orders them. Scratch
 * partials and the padding columns of dout and dwte start as NaN. Checks:
 *  - integer-valued dout: every id's dwte row equals the exact sum of its
 *    rows (each row added exactly once, into the right id; out-of-shard
 *    rows nowhere), ids without rows and padding columns untouched;
 *  - random dout: bitwise equal to the documented order (a run inside one
 *    tile: dwte + rows in order; a run over several tiles: dwte + the
 *    per-tile partials 0 + rows, in tile order);
 *  - the tile length fits the scratch it is given. */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "emu_cuda.h"
/* the kernels' own C interface (the dtype and error codes, the views),
 * over the stub cuda_runtime.h that emu_common.sh writes */
#include "cuda_kernels.h"
#define NT 256

struct Block {
    emu::Barrier bar;
    uint32_t sk[64];
    int32_t sv[64];
    explicit Block(int n) : bar(n) {}
};
Block *g_blk;
static inline void __syncthreads() { g_blk->bar.arrive_and_wait(); }
static inline int64_t cuk_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

#include "kern.inc"

static_assert(EMB_CHUNK <= 64, "the emulated shared arrays hold 64 positions");

static std::mt19937 g_rng(4242);

/* Every block of grid g (blockDim nt) in a shuffled order, each as nt threads. */
template <class F> static void launch(dim3 g, unsigned nt, F f) {
    std::vector<std::pair<unsigned, unsigned>> order;
    for (unsigned y = 0; y < g.y; y++)
        for (unsigned x = 0; x < g.x; x++) order.push_back({x, y});
    std::shuffle(order.begin(), order.end(), g_rng);
    for (auto [bx, by] : order) {
        Block blk((int)nt);
        blockIdx = dim3(bx, by, 0);
        blockDim = dim3(nt, 1, 1);
        gridDim = g;
        g_blk = &blk;
        emu::run_block(nt, f);
    }
}

static int esz(int dt) { return dt == CUK_F32 ? 4 : 2; }
static const char *dtname(int dt) { return dt == CUK_F32 ? "f32" : dt == CUK_BF16 ? "bf16" : "f16"; }

struct Buf {
    int dt;
    int64_t n;
    std::vector<unsigned char> b;
    Buf(int dt_, int64_t n_) : dt(dt_), n(n_), b((size_t)n_ * esz(dt_) + 64) {
        for (int64_t i = 0; i < n; i++) set(i, NAN);
    }
    void *p() { return b.data(); }
    float get(int64_t i) const { return ldf(b.data(), dt, i); }
    void set(int64_t i, float v) { stf(b.data(), dt, i, v); }
};

static int g_fail = 0, g_pass = 0;
static void expect(bool ok, const std::string &what) {
    if (ok) g_pass++;
    else {
        g_fail++;
        printf("  FAIL %s\n", what.c_str());
    }
}
static bool same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

struct Case {
    std::string name;
    std::vector<int32_t> tok;
    int64_t v, voff, cols, ld;
    int dt;
    size_t avail; /* scratch bytes for partials; SIZE_MAX: plenty */
};

/* Runs the dwte path on c; integer-valued dout when ints. */
static void run_case(const Case &c, bool ints) {
    const int64_t n = (int64_t)c.tok.size(), v = c.v, cols = c.cols, ld = c.ld;
    std::string tag = c.name + " " + dtname(c.dt) + (ints ? " ints" : " reals");
    /* keys and the stable sort (k_embed_keys + cub) */
    std::vector<uint32_t> keys(n);
    std::vector<int32_t> vals(n);
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = (int64_t)c.tok[i] - c.voff;
        keys[i] = (uint32_t)(id >= 0 && id < v ? id : v);
    }
    std::iota(vals.begin(), vals.end(), 0);
    std::stable_sort(vals.begin(), vals.end(), [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
    std::vector<uint32_t> skeys(n);
    for (int64_t i = 0; i < n; i++) skeys[i] = keys[vals[i]];
    /* inputs: padding columns stay NaN */
    Buf dout(c.dt, n * ld), dwte0(CUK_F32, v * ld);
    std::uniform_int_distribution<int> ui(-64, 64);
    std::normal_distribution<float> nd(0, 1);
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < cols; j++) dout.set(r * ld + j, ints ? (float)ui(g_rng) : nd(g_rng));
    for (int64_t r = 0; r < v; r++)
        for (int64_t j = 0; j < cols; j++) dwte0.set(r * ld + j, ints ? (float)ui(g_rng) : nd(g_rng));
    /* the launcher's choices */
    emb_tiles tl;
    tl.n = n;
    tl.S = emb_tile_len(n, cols, c.avail);
    tl.ntiles = cuk_cdiv(n, tl.S);
    tl.ldp = emb_ldp(cols);
    expect(tl.S % EMB_CHUNK == 0 && (tl.S >= n || emb_part_bytes(n, tl.S, cols) <= c.avail),
           tag + ": tile length fits the scratch");
    const size_t pb = emb_part_bytes(n, tl.S, cols);
    expect(tl.S < n || pb <= emb_part_bytes(1, 1, cols), tag + ": one tile needs only the reserved slots");
    const int64_t nch = (cols + 7) >> 3, bt = 32 * cuk_cdiv(nch, 32);
    const unsigned nt = (unsigned)(bt > EMB_NT ? EMB_NT : bt);
    const dim3 g((unsigned)(tl.ntiles > (1 << 20) ? (1 << 20) : tl.ntiles), (unsigned)cuk_cdiv(nch, nt));
    std::vector<std::vector<unsigned char>> results;
    for (int rep = 0; rep < 2; rep++) {
        Buf dwte = dwte0;
        std::vector<float> part(pb / 4 + 16, NAN);
        tl.part = part.data();
        cuk_mat mw = {dwte.p(), v, cols, ld, CUK_F32}, md = {dout.p(), n, cols, ld, c.dt};
        const uint32_t *kp = skeys.data();
        const int32_t *vp = vals.data();
        launch(g, nt, [&] {
            if (c.dt == CUK_F32) k_embed_tiles<CUK_F32>(mw, md, kp, vp, tl);
            else if (c.dt == CUK_BF16) k_embed_tiles<CUK_BF16>(mw, md, kp, vp, tl);
            else k_embed_tiles<CUK_F16>(mw, md, kp, vp, tl);
        });
        if (tl.ntiles > 1) launch(g, nt, [&] { k_embed_finish(mw, kp, tl); });
        results.push_back(dwte.b);
    }
    expect(results[0] == results[1], tag + ": bitwise equal under another block order");
    Buf got(CUK_F32, v * ld);
    got.b = results[0];
    /* references */
    int64_t bad_exact = 0, bad_order = 0, bad_untouched = 0, runs = 0, split = 0;
    std::vector<char> seen(v, 0);
    for (int64_t rs = 0; rs < n;) {
        int64_t re = rs + 1;
        while (re < n && skeys[re] == skeys[rs]) re++;
        const uint32_t K = skeys[rs];
        if (K < v) {
            runs++;
            seen[K] = 1;
            const int64_t ta = rs / tl.S, tb = (re - 1) / tl.S;
            split += ta != tb;
            for (int64_t j = 0; j < cols; j++) {
                const float g0 = got.get(K * ld + j);
                double ex = dwte0.get(K * ld + j);
                for (int64_t k = rs; k < re; k++) ex += dout.get((int64_t)vals[k] * ld + j);
                if (ints && (double)g0 != ex) bad_exact++;
                float acc = dwte0.get(K * ld + j);
                if (ta == tb) {
                    for (int64_t k = rs; k < re; k++) acc += dout.get((int64_t)vals[k] * ld + j);
                } else {
                    for (int64_t u = ta; u <= tb; u++) {
                        float p = 0.0f;
                        for (int64_t k = std::max(rs, u * tl.S); k < std::min(re, (u + 1) * tl.S); k++)
                            p += dout.get((int64_t)vals[k] * ld + j);
                        acc += p;
                    }
                }
                if (!same_bits(acc, g0)) bad_order++;
            }
        }
        rs = re;
    }
    for (int64_t r = 0; r < v; r++)
        for (int64_t j = 0; j < ld; j++) {
            const bool keep = j >= cols || !seen[r];
            if (keep && !same_bits(got.get(r * ld + j), dwte0.get(r * ld + j))) bad_untouched++;
        }
    if (ints) expect(bad_exact == 0, tag + ": exact sums (" + std::to_string(bad_exact) + " wrong)");
    expect(bad_order == 0, tag + ": documented order, bitwise (" + std::to_string(bad_order) + " differ)");
    expect(bad_untouched == 0, tag + ": other rows and padding untouched (" + std::to_string(bad_untouched) + ")");
    printf("  %-34s n %5lld cols %4lld/%4lld S %5lld tiles %4lld runs %4lld (%lld over tiles) block %u x %u\n",
           tag.c_str(), (long long)n, (long long)cols, (long long)ld, (long long)tl.S, (long long)tl.ntiles,
           (long long)runs, (long long)split, nt, g.y);
}

static std::vector<int32_t> skewed(int64_t n, const std::vector<std::pair<int32_t, double>> &ids) {
    std::vector<double> w;
    for (auto &p : ids) w.push_back(p.second);
    std::discrete_distribution<int> dd(w.begin(), w.end());
    std::vector<int32_t> t(n);
    for (auto &x : t) x = ids[dd(g_rng)].first;
    return t;
}

static std::vector<int32_t> zipf(int64_t n, int64_t distinct, int64_t base) {
    std::vector<std::pair<int32_t, double>> ids;
    std::vector<int32_t> perm(distinct);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g_rng); /* frequent ids spread over the id range */
    for (int64_t r = 0; r < distinct; r++) ids.push_back({(int32_t)(base + perm[r]), 1.0 / (double)(r + 1)});
    return skewed(n, ids);
}

int main() {
    std::vector<Case> cases;
    const size_t big = SIZE_MAX;
    /* 4096 tokens from 5 in-shard ids (one very long run) and one outside the shard [20, 70) */
    auto five = skewed(4096, {{33, 0.6}, {21, 0.2}, {69, 0.1}, {40, 0.05}, {20, 0.03}, {5, 0.02}});
    for (int dt : {CUK_BF16, CUK_F32}) cases.push_back({"five ids", five, 50, 20, 72, 72, dt, big});
    cases.push_back({"five ids, partial chunk", five, 50, 20, 75, 80, CUK_F16, big});
    cases.push_back({"five ids, S 256", five, 50, 20, 72, 72, CUK_BF16, (size_t)2 * 16 * 72 * 4});
    cases.push_back({"five ids, one tile", five, 50, 20, 72, 72, CUK_BF16, 0});
    /* all distinct */
    std::vector<int32_t> perm(3000);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g_rng);
    cases.push_back({"all distinct", perm, 3500, 0, 40, 40, CUK_BF16, big});
    /* Zipf over 1000 ids at GPT-2 width, n not a multiple of the tile */
    cases.push_back({"zipf 1000 ids", zipf(5003, 1000, 0), 1000, 0, 768, 768, CUK_BF16, big});
    /* a shard in the middle of the vocabulary: most tokens outside */
    cases.push_back({"shard of 100 of 800", zipf(2000, 800, 0), 100, 300, 24, 24, CUK_F32, big});
    std::vector<int32_t> outside(500, 7);
    cases.push_back({"all outside", outside, 10, 100, 16, 16, CUK_BF16, big});
    /* runs ending exactly on tile boundaries */
    std::vector<int32_t> al;
    for (auto [id, cnt] : std::vector<std::pair<int, int>>{{0, 128}, {1, 64}, {2, 1}, {3, 127}, {4, 64}})
        for (int i = 0; i < cnt; i++) al.push_back(id);
    std::shuffle(al.begin(), al.end(), g_rng);
    cases.push_back({"tile-aligned runs", al, 5, 0, 8, 8, CUK_BF16, big});
    std::vector<int32_t> small(51);
    for (int i = 0; i < 51; i++) small[i] = (i * 31) % 7;
    cases.push_back({"51 tokens", small, 7, 0, 70, 72, CUK_F32, big});
    /* wider than one block (two column slices) */
    cases.push_back({"wide rows", zipf(700, 12, 3), 20, 0, 2100, 2104, CUK_F32, big});
    for (const Case &c : cases) {
        run_case(c, true);
        run_case(c, false);
    }
    printf("embed_emu: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
